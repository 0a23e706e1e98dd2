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
    assert client.get("/api/v1/jobs", headers=bearer(tokens["worker"])).status_code == 200


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
