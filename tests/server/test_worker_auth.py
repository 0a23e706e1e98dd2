"""The claim and report routes' token check (``api.worker_auth``): a grant is reused for a short
time, and a revoked token or a deleted worker is refused once that time has passed."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete

from tuner_service.api.worker_auth import WorkerGrants, bearer_secret
from tuner_service.db.engine import Database
from tuner_service.db.models import Worker
from tuner_service.settings import Settings

from .fakes import FakeWorker, bearer

TTL_S = 0.5


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_grant_lasts_its_ttl_and_no_longer() -> None:
    clock = Clock()
    grants = WorkerGrants(2.0, clock=clock)
    worker = Worker(id=7)
    grants.put("digest", 7, worker)
    assert grants.get("digest", 7) is worker
    assert grants.get("digest", 8) is None and grants.get("other", 7) is None
    clock.now += 1.99
    assert grants.get("digest", 7) is worker  # not renewed by use ...
    clock.now += 0.01
    assert grants.get("digest", 7) is None  # ... so it ends 2 s after the check
    assert len(grants) == 0


def test_grants_are_bounded_and_a_zero_ttl_keeps_none() -> None:
    clock = Clock()
    grants = WorkerGrants(10.0, max_grants=3, clock=clock)
    for n in range(5):
        grants.put(f"d{n}", n, Worker(id=n))
        clock.now += 1
    assert len(grants) == 3
    assert grants.get("d0", 0) is None and grants.get("d4", 4) is not None  # oldest went first
    off = WorkerGrants(0.0, clock=clock)
    off.put("d", 1, Worker(id=1))
    assert off.get("d", 1) is None and len(off) == 0


@pytest.mark.parametrize(("header", "secret"), [
    (None, ""), ("", ""), ("Bearer", ""), ("Bearer   ", ""), ("Basic abc", ""),
    ("Bearer tnr_x", "tnr_x"), ("bearer  tnr_x ", "tnr_x"), ("BEARER tnr_x", "tnr_x"),
])
def test_the_bearer_token_is_read_as_fastapi_reads_it(header: str | None, secret: str) -> None:
    assert bearer_secret(header) == secret


@pytest.fixture
def short_grants(settings: Settings, make_client: Callable[[Settings], TestClient]
                 ) -> TestClient:
    return make_client(settings.with_overrides(worker_auth_cache_s=TTL_S, run_driver=False))


def _claim(client: TestClient, worker: FakeWorker, secret: str) -> int:
    answer = client.post(worker.url("claim"), headers=bearer(secret), json={"max_items": 1})
    assert answer.status_code == 200 or answer.json()["detail"], answer.text
    return answer.status_code


def _wait_past_ttl(client: TestClient, worker: FakeWorker, secret: str, status: int) -> None:
    """Claims are answered ``status`` once the grant has expired (at most the TTL after)."""
    time.sleep(TTL_S + 0.05)
    assert _claim(client, worker, secret) == status


def test_a_revoked_token_is_refused_once_its_grant_expires(
        short_grants: TestClient, settings: Settings) -> None:
    from tuner_service import auth

    db = Database(settings.resolved_database_url)
    try:
        with db.session() as session:
            token, secret = auth.create_token(session, "worker", "to-revoke")
        worker = FakeWorker(short_grants, secret)
        assert _claim(short_grants, worker, secret) == 200  # granted, and remembered
        with db.session() as session:
            assert auth.revoke(session, token.id)
        _wait_past_ttl(short_grants, worker, secret, 401)
        answer = short_grants.post(worker.url("results"), headers=bearer(secret),
                                   json={"results": []})
        assert answer.status_code == 401 and "revoked" in answer.json()["detail"]
    finally:
        db.dispose()


def test_a_deleted_worker_is_refused_once_its_grant_expires(
        short_grants: TestClient, settings: Settings, tokens: dict[str, str]) -> None:
    worker = FakeWorker(short_grants, tokens["worker"])
    assert _claim(short_grants, worker, tokens["worker"]) == 200
    db = Database(settings.resolved_database_url)
    try:
        with db.session() as session:
            session.execute(delete(Worker).where(Worker.id == worker.worker_id))
    finally:
        db.dispose()
    _wait_past_ttl(short_grants, worker, tokens["worker"], 404)


def test_refusals_are_never_remembered(short_grants: TestClient, settings: Settings,
                                       tokens: dict[str, str]) -> None:
    """A token refused once (here: another token's worker) is looked up again each time, and
    a grant for one worker does not extend to another."""
    mine = FakeWorker(short_grants, tokens["worker"])
    theirs = FakeWorker(short_grants, tokens["admin"])
    assert _claim(short_grants, mine, tokens["worker"]) == 200
    for _ in range(3):
        assert _claim(short_grants, theirs, tokens["worker"]) == 403
    assert len(short_grants.app.state.worker_grants) == 1  # type: ignore[attr-defined]
