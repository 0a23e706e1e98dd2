"""The HTTP client maps answers to errors; the backoff grows and is capped."""

from __future__ import annotations

import random

import httpx
import pytest

from workers.backoff import Backoff
from workers.client import ServerClient
from workers.errors import ProtocolError, ServerRejected, ServerUnavailable


def client_answering(status: int, body: object = None, text: str | None = None
                     ) -> ServerClient:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["Authorization"] == "Bearer t"
        assert request.url.path.startswith("/api/v1/workers/")
        if text is not None:
            return httpx.Response(status, text=text)
        return httpx.Response(status, json=body)

    return ServerClient("http://server", "t", transport=httpx.MockTransport(handler))


def test_answers_are_returned() -> None:
    client = client_answering(200, {"items": [{"measure_id": 1}]})
    assert client.claim("w1", 2, 0.1) == [{"measure_id": 1}]


@pytest.mark.parametrize("status", [500, 502, 503, 429])
def test_5xx_means_unavailable(status: int) -> None:
    with pytest.raises(ServerUnavailable):
        client_answering(status, {}).report("w1", [])


@pytest.mark.parametrize(("header", "seconds"), [("7", 7.0), ("0.5", 0.5), ("99999", 300.0),
                                               ("Wed, 21 Oct 2026 07:28:00 GMT", None),
                                               ("-3", None)])
def test_a_503_says_when_to_retry(header: str, seconds: float | None) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"detail": "busy"}, headers={"Retry-After": header})

    client = ServerClient("http://server", "t", transport=httpx.MockTransport(handler))
    with pytest.raises(ServerUnavailable) as info:
        client.report("w1", [])
    assert info.value.retry_after_s == seconds


def test_4xx_means_rejected() -> None:
    with pytest.raises(ServerRejected) as info:
        client_answering(401, {"detail": "no"}).release("w1", [1])
    assert info.value.status == 401


def test_malformed_answers_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError):
        client_answering(200, text="<html>").heartbeat("w1", [])
    with pytest.raises(ProtocolError):
        client_answering(200, {"nope": 1}).claim("w1", 1, 0.1)
    with pytest.raises(ProtocolError):
        client_answering(200, {}).register({})


def test_an_unreachable_server_is_unavailable() -> None:
    client = ServerClient("http://127.0.0.1:9", "t", timeout_s=1.0)
    with pytest.raises(ServerUnavailable):
        client.register({})


def test_the_stub_server_speaks_the_protocol(stub_server) -> None:  # type: ignore[no-untyped-def]
    stub_server.queue.append({"measure_id": 5})
    with ServerClient(stub_server.url, "secret") as client:
        worker_id = client.register({"device_key": "k"})["worker_id"]
        assert client.claim(worker_id, 4, 0.1) == [{"measure_id": 5}]
        assert client.report(worker_id, [{"measure_id": 5}])["accepted"] == [5]
        assert client.report(worker_id, [{"measure_id": 5}])["duplicates"] == [5]
    with ServerClient(stub_server.url, "wrong") as client, pytest.raises(ServerRejected):
        client.register({})


def test_backoff_grows_to_its_cap_and_resets() -> None:
    backoff = Backoff(initial_s=0.5, cap_s=4.0, jitter=0.0, rng=random.Random(0))
    assert [backoff.next_delay() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    backoff.reset()
    assert backoff.next_delay() == 0.5
    jittered = Backoff(initial_s=1.0, jitter=0.2, rng=random.Random(1))
    assert 0.8 <= jittered.next_delay() <= 1.2
