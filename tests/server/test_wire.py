"""The claim and report routes read their own body (``api.wire``): a malformed one gets the 4xx
FastAPI gave it, with a message, never a 500; the OpenAPI document still describes both."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from .fakes import FakeWorker, bearer

JSON = {"Content-Type": "application/json"}

#: (body, content type, status, what the first error says): the answers the FastAPI routes gave
MALFORMED: dict[str, tuple[bytes, str | None, int, str]] = {
    "empty": (b"", "application/json", 422, "Field required"),
    "truncated": (b'{"max_items": ', "application/json", 422, "JSON decode error"),
    "not json": (b"max_items=1", "application/json", 422, "JSON decode error"),
    "a list": (b"[1, 2]", "application/json", 422, "valid dictionary"),
    "null": (b"null", "application/json", 422, "valid dictionary"),
    "text/plain": (b'{"max_items": 1}', "text/plain", 422, "valid dictionary"),
    "no content type": (b'{"max_items": 1}', None, 422, "valid dictionary"),
    "bad utf-8": (b'{"x": "\xff"}', "application/json", 400, "error parsing the body"),
    "nested too deep": (b"[" * 5000 + b"]" * 5000, "application/json", 422, "nested too deep"),
    "deeper than 32": (b'{"x": ' + b"[" * 40 + b"]" * 40 + b"}", "application/json", 422,
                       "nested deeper than 32"),
    "NaN": (b'{"wait_s": NaN}', "application/json", 422, "finite"),
    "beyond 64 bits": (b'{"max_items": 1' + b"0" * 30 + b"}", "application/json", 422,
                       "64-bit"),
    "NUL": (b'{"x": "a\\u0000"}', "application/json", 422, "NUL"),
    "lone surrogate": (b'{"x": "\\ud800"}', "application/json", 422, "surrogate"),
}
CLAIMS = {
    "max_items 0": (b'{"max_items": 0}', "greater than or equal to 1"),
    "max_items 10001": (b'{"max_items": 10001}', "less than or equal to 10000"),
    "max_items 1.5": (b'{"max_items": 1.5}', "fractional part"),
    "wait_s -1": (b'{"wait_s": -1}', "greater than or equal to 0"),
    "wait_s text": (b'{"wait_s": "soon"}', "valid number"),
}
REPORTS = {
    "results text": (b'{"results": "all of them"}', "valid list"),
    "no results": (b"{}", "Field required"),
    "measure_id 0": (b'{"results": [{"measure_id": 0, "costs": [1e-3]}]}', "greater than"),
    "error_kind 42": (b'{"results": [{"measure_id": 1, "costs": [1e-3], "error_kind": 42}]}',
                      "less than or equal to 8"),
    "a day and more": (b'{"results": [{"measure_id": 1, "compile_time_s": 1e9}]}',
                       "less than or equal to 86400"),
}


@pytest.fixture
def worker(client: TestClient, tokens: dict[str, str]) -> FakeWorker:
    return FakeWorker(client, tokens["worker"])


def _post(worker: FakeWorker, call: str, body: bytes, content_type: str | None = None) -> object:
    headers = dict(worker.headers)
    if content_type is not None:
        headers["Content-Type"] = content_type
    return worker.client.post(worker.url(call), content=body, headers=headers)


def _check(answer: object, status: int, says: str) -> None:
    assert answer.status_code == status, answer.text  # type: ignore[attr-defined]
    detail = answer.json()["detail"]  # type: ignore[attr-defined]
    text = detail if isinstance(detail, str) else detail[0]["msg"]
    assert says in text, detail


@pytest.mark.parametrize("call", ["claim", "results"])
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_body_gets_a_4xx_with_a_message(worker: FakeWorker, call: str,
                                                    case: str) -> None:
    body, content_type, status, says = MALFORMED[case]
    _check(_post(worker, call, body, content_type), status, says)


@pytest.mark.parametrize("case", sorted(CLAIMS))
def test_an_invalid_claim_names_the_field_and_its_limit(worker: FakeWorker, case: str) -> None:
    body, says = CLAIMS[case]
    answer = _post(worker, "claim", body, "application/json")
    _check(answer, 422, says)
    assert answer.json()["detail"][0]["loc"][0] == "body"  # type: ignore[attr-defined]


@pytest.mark.parametrize("case", sorted(REPORTS))
def test_an_invalid_report_names_the_field_and_its_limit(worker: FakeWorker, case: str) -> None:
    body, says = REPORTS[case]
    _check(_post(worker, "results", body, "application/json"), 422, says)


def test_the_body_is_decoded_before_the_token_is_checked(client: TestClient,
                                                         worker: FakeWorker) -> None:
    """As with FastAPI's body parameters: broken JSON is a 422 even without a token; a
    well-formed body without one is a 401."""
    url = worker.url("claim")
    assert client.post(url, content=b"{", headers=JSON).status_code == 422
    assert client.post(url, json={"max_items": 1}).status_code == 401
    assert client.post(url, content=b"{", headers=bearer("tnr_nope") | JSON).status_code == 422
    assert client.post("/api/v1/workers/0/claim", json={}).status_code == 422  # the path first


def test_the_openapi_document_describes_both_bodies(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    claim = paths["/api/v1/workers/{worker_id}/claim"]["post"]
    report = paths["/api/v1/workers/{worker_id}/results"]["post"]
    for operation in (claim, report):
        assert operation["security"] == [{"HTTPBearer": []}]
        assert operation["requestBody"]["required"] is True
        assert [p["name"] for p in operation["parameters"]] == ["worker_id"]
        assert "$ref" in str(operation["responses"]["200"])
        assert "$defs" not in str(operation)  # every definition inlined
    schema = claim["requestBody"]["content"]["application/json"]["schema"]
    assert schema["properties"]["max_items"]["maximum"] == 10_000
    schema = report["requestBody"]["content"]["application/json"]["schema"]
    result = schema["properties"]["results"]["items"]
    assert result["properties"]["measure_id"]["minimum"] == 1
    assert "timings" in result["properties"]


def test_a_report_is_walked_once_and_nested_bad_values_are_still_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.exceptions import RequestValidationError

    from tuner_service.api import schemas, wire, worker_schemas

    walks: list[object] = []
    check = schemas.check_tree

    def counted(value: object, *args: int) -> None:
        walks.append(value)
        check(value, *args)

    monkeypatch.setattr(schemas, "check_tree", counted)
    result = {"measure_id": 1, "costs": [1e-3], "timings": {"measure_s": 0.1}}
    body = wire.validate(worker_schemas.ResultsIn, {"results": [result] * 16})
    assert len(body.results) == 16 and len(walks) == 1  # not 33 (each result and timings)
    worker_schemas.ResultsIn.model_validate({"results": [result] * 16})
    assert len(walks) == 1 + 33  # without a context (FastAPI's own routes) every body walks
    with pytest.raises(RequestValidationError) as refused:
        wire.validate(worker_schemas.ResultsIn, {"results": [{**result, "x": "a\x00"}]})
    assert "results[0].x" in str(refused.value.errors())


@pytest.mark.parametrize("cost", [b"NaN", b"Infinity", b"-Infinity"])
def test_a_non_finite_cost_is_refused_for_what_it_is(worker: FakeWorker, cost: bytes) -> None:
    """The result alone is refused, and its reason says why: its costs were not finite (the
    clean-up ran twice and the second pass, seeing the emptied costs, said none were given)."""
    body = b'{"results": [{"measure_id": 5, "costs": [' + cost + b']}]}'
    answer = _post(worker, "results", body, "application/json")
    assert answer.status_code == 200, answer.text  # type: ignore[attr-defined]
    statuses = answer.json()["statuses"]  # type: ignore[attr-defined]
    assert statuses == [{"measure_id": 5, "status": "rejected",
                         "reason": "costs must be positive finite seconds"}]
