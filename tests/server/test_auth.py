"""Every write needs a token with the right role; tokens are stored hashed."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import select

from tuner_service.db.engine import Database
from tuner_service.db.models import Token
from tuner_service.settings import Settings

from .fakes import FakeWorker, bearer

JOB = {"workloads": ["dense:M=8,N=16,K=32"], "trials_per_task": 2}


def test_missing_and_invalid_tokens_get_401(client: TestClient) -> None:
    answer = client.post("/api/v1/jobs", json=JOB)
    assert answer.status_code == 401 and "bearer" in answer.json()["detail"].lower()
    assert answer.headers["www-authenticate"] == "Bearer"
    answer = client.post("/api/v1/jobs", json=JOB, headers=bearer("tnr_wrong"))
    assert answer.status_code == 401


def test_worker_token_cannot_submit_jobs_or_import_records(client: TestClient,
                                                           tokens: dict[str, str]) -> None:
    worker = bearer(tokens["worker"])
    assert client.post("/api/v1/jobs", json=JOB, headers=worker).status_code == 403
    assert client.post("/api/v1/records", content=b"", headers=worker).status_code == 403
    files = {"file": ("m.onnx", b"x", "application/octet-stream")}
    assert client.post("/api/v1/models", files=files, headers=worker).status_code == 403


def test_user_token_cannot_act_as_a_worker(client: TestClient, tokens: dict[str, str]) -> None:
    user = bearer(tokens["user"])
    body = {"device_key": "d", "target": "llvm"}
    assert client.post("/api/v1/workers/register", json=body, headers=user).status_code == 403
    worker = FakeWorker(client, tokens["worker"])
    answer = client.post(worker.url("results"), headers=user,
                         json={"results": [{"measure_id": 1, "costs": [1.0]}]})
    assert answer.status_code == 403


def test_a_worker_id_belongs_to_the_token_that_registered_it(
        client: TestClient, settings: Settings, tokens: dict[str, str]) -> None:
    from tuner_service import auth

    worker = FakeWorker(client, tokens["worker"])
    db = Database(settings.resolved_database_url)
    with db.session() as session:
        other = auth.create_token(session, "worker", "other")[1]
    db.dispose()
    answer = client.post(worker.url("claim"), headers=bearer(other), json={"max_items": 1})
    assert answer.status_code == 403
    admin = client.post(worker.url("claim"), headers=bearer(tokens["admin"]),
                        json={"max_items": 1})
    assert admin.status_code == 200


def test_tokens_are_stored_hashed(settings: Settings, tokens: dict[str, str]) -> None:
    db = Database(settings.resolved_database_url)
    with db.session() as session:
        stored = set(session.scalars(select(Token.token_hash)))
    db.dispose()
    assert not stored & set(tokens.values())
    assert all(len(h) == 64 for h in stored)


def test_reads_can_require_a_token(settings: Settings, make_client: object,
                                   tokens: dict[str, str]) -> None:
    client = make_client(settings.with_overrides(read_requires_token=True))  # type: ignore[operator]
    assert client.get("/api/v1/jobs").status_code == 401
    assert client.get("/api/v1/jobs", headers=bearer(tokens["user"])).status_code == 200
    # a worker token reads only what a worker needs: no one's jobs, records or dashboard
    worker = bearer(tokens["worker"])
    for path in ("/api/v1/jobs", "/api/v1/records", "/api/v1/workers",
                 "/api/v1/dashboard/jobs", "/api/v1/tuning-log/stale"):
        answer = client.get(path, headers=worker)
        assert answer.status_code == 403 and "worker token" in answer.json()["detail"], path
    assert client.get("/api/v1/tuning-log", headers=worker).status_code == 200
    assert client.get("/api/v1/health").status_code == 200


def _token(settings: Settings, role: str, device_key: str | None = None) -> str:
    from tuner_service import auth

    db = Database(settings.resolved_database_url)
    try:
        with db.session() as session:
            return auth.create_token(session, role, f"extra-{role}", device_key=device_key)[1]
    finally:
        db.dispose()


def test_a_worker_token_bound_to_a_device_key_registers_only_that_key(
        client: TestClient, settings: Settings) -> None:
    bound = bearer(_token(settings, "worker", device_key="gpu-a"))
    ok = client.post("/api/v1/workers/register", headers=bound,
                     json={"device_key": "gpu-a", "target": "llvm"})
    assert ok.status_code == 201, ok.text
    other = client.post("/api/v1/workers/register", headers=bound,
                        json={"device_key": "gpu-b", "target": "llvm"})
    assert other.status_code == 403
    assert "bound to device key 'gpu-a'" in other.json()["detail"]


def test_only_worker_tokens_take_a_device_key(settings: Settings) -> None:
    import pytest

    from tuner_service.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="worker token"):
        _token(settings, "user", device_key="k")


def test_cli_creates_a_bound_worker_token(migrated_url: str, capsys: object) -> None:
    from tuner_service import auth
    from tuner_service.cli.main import main

    assert main(["token", "create", "--role", "worker", "--device-key", "epyc-9",
                 "--database", migrated_url]) == 0
    secret = capsys.readouterr().out.strip()  # type: ignore[attr-defined]
    db = Database(migrated_url)
    with db.session() as session:
        token = auth.authenticate(session, secret)
        assert token is not None and (token.role, token.device_key) == ("worker", "epyc-9")
    db.dispose()


def test_only_the_owner_or_an_admin_cancels_a_job(client: TestClient, settings: Settings,
                                                  tokens: dict[str, str]) -> None:
    created = client.post("/api/v1/jobs", json=JOB, headers=bearer(tokens["user"]))
    job_id = created.json()["job_id"]
    stranger = bearer(_token(settings, "user"))
    refused = client.post(f"/api/v1/jobs/{job_id}/cancel", headers=stranger)
    assert refused.status_code == 403 and "owner" in refused.json()["detail"]
    assert client.get(f"/api/v1/jobs/{job_id}").json()["status"] != "cancelled"
    owner = client.post(f"/api/v1/jobs/{job_id}/cancel", headers=bearer(tokens["user"]))
    assert owner.status_code == 200 and owner.json()["status"] == "cancelled"
    second = client.post("/api/v1/jobs", json=JOB, headers=bearer(tokens["user"])).json()
    admin = client.post(f"/api/v1/jobs/{second['job_id']}/cancel",
                        headers=bearer(tokens["admin"]))
    assert admin.status_code == 200 and admin.json()["status"] == "cancelled"


def test_cli_token_create(migrated_url: str, capsys: object) -> None:
    from tuner_service.cli.main import main

    assert main(["token", "create", "--role", "user", "--database", migrated_url]) == 0
    secret = capsys.readouterr().out.strip()  # type: ignore[attr-defined]
    db = Database(migrated_url)
    with db.session() as session:
        from tuner_service import auth

        token = auth.authenticate(session, secret)
        assert token is not None and token.role == "user"
    db.dispose()
