"""The REST API: uploads, jobs, errors as clear 4xx, best configs, history, records."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from tuner_service.settings import Settings

from .fakes import TOY_TARGET, FakeWorker, bearer


@pytest.fixture(scope="module")
def resnet18_bytes() -> bytes:
    from tuner_service.compiler.frontend.samples import build_sample_model

    return bytes(build_sample_model("resnet18").SerializeToString())


def _upload(client: TestClient, token: str, data: bytes) -> tuple[int, dict]:
    answer = client.post("/api/v1/models", headers=bearer(token),
                         files={"file": ("resnet18.onnx", data, "application/octet-stream")})
    return answer.status_code, answer.json()


def _run_job(client: TestClient, tokens: dict[str, str], **fields: object) -> int:
    # random: these tests are about the service's bookkeeping, and the toy template cannot be
    # lowered into the loop nests the learned tuners read their features from
    body = {"workloads": ["dense:M=8,N=16,K=32"], "trials_per_task": 4, "tuner": "random",
            **fields}
    answer = client.post("/api/v1/jobs", headers=bearer(tokens["user"]), json=body)
    assert answer.status_code == 201, answer.text
    job_id: int = answer.json()["job_id"]
    target = str(fields.get("target", "llvm"))
    FakeWorker(client, tokens["worker"], target=target).run_until_done(job_id)
    return job_id


def test_model_upload_is_idempotent_and_lists_tasks(client: TestClient, tokens: dict[str, str],
                                                   resnet18_bytes: bytes) -> None:
    status, first = _upload(client, tokens["user"], resnet18_bytes)
    assert status == 201, first
    assert first["tasks"] and {"task_id", "workload", "weight", "flops"} <= set(first["tasks"][0])
    assert isinstance(first["unsupported"], list)
    _, again = _upload(client, tokens["user"], resnet18_bytes)
    assert again["model_id"] == first["model_id"] and again["tasks"] == first["tasks"]
    answer = client.post("/api/v1/jobs", headers=bearer(tokens["user"]),
                         json={"model_id": first["model_id"], "trials_per_task": 1})
    assert answer.status_code == 201
    job = client.get(f"/api/v1/jobs/{answer.json()['job_id']}").json()
    assert len(job["tasks"]) == len(first["tasks"])


def test_bad_uploads_get_4xx(settings: Settings, make_client: Callable[[Settings], TestClient],
                             tokens: dict[str, str], resnet18_bytes: bytes) -> None:
    client = make_client(settings.with_overrides(max_upload_bytes=1000))
    assert _upload(client, tokens["user"], resnet18_bytes)[0] == 413
    status, body = _upload(client, tokens["user"], b"\x08\x07garbage-not-onnx")
    assert status == 422 and body["detail"]
    assert _upload(client, tokens["user"], b"")[0] == 422


@pytest.mark.parametrize("body", [
    {"workloads": ["dense:M=0,N=1,K=1"]},
    {"workloads": ["nonsense"]},
    {"workloads": ["dense:M=8,N=16,K=32"], "tuner": "no-such-tuner"},
    {"workloads": ["dense:M=8,N=16,K=32"], "target": "no-such-target"},
    {"workloads": []},
    {"workloads": ["dense:M=8,N=16,K=32"], "trials_per_task": 0},
    {"workloads": ["dense:M=8,N=16,K=32"], "options": {"repeat": "many"}},
    {"model_id": 10**12},
])
def test_bad_job_requests_get_422(client: TestClient, tokens: dict[str, str],
                                  body: dict) -> None:
    answer = client.post("/api/v1/jobs", headers=bearer(tokens["user"]), json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"]


def test_lookups_404_and_422(client: TestClient) -> None:
    assert client.get("/api/v1/jobs/999").status_code == 404
    assert client.get(f"/api/v1/jobs/{10**20}").status_code == 422
    assert client.post("/api/v1/jobs", json={"model_id": 999}).status_code == 401
    best = client.get("/api/v1/best", params={"workload": "dense:M=8,N=16,K=32"})
    assert best.status_code == 404
    bad = client.get("/api/v1/best", params={"workload": "dense:M=x"})
    assert bad.status_code == 422


def test_job_views_history_and_logs(client: TestClient, tokens: dict[str, str]) -> None:
    job_id = _run_job(client, tokens)
    job = client.get(f"/api/v1/jobs/{job_id}").json()
    task = job["tasks"][0]
    assert task["trials_done"] == 4 and task["template"] == "dense.x86" and task["description"]
    history = client.get(f"/api/v1/jobs/{job_id}/history",
                         params={"task_id": task["task_id"]}).json()["points"]
    assert [p["trial"] for p in history] == [1, 2, 3, 4]
    later = client.get(f"/api/v1/jobs/{job_id}/history",
                       params={"task_id": task["task_id"], "after": 3}).json()["points"]
    assert [p["trial"] for p in later] == [4]
    assert client.get("/api/v1/jobs").json()[0]["job_id"] == job_id
    log = client.get("/api/v1/tuning-log", params={"op": "dense"}).json()
    assert log[0]["workload"] == "dense:M=8,N=16,K=32" and log[0]["job_id"] == job_id
    assert client.get("/api/v1/workers").json()[0]["online"] is True
    assert client.get("/api/v1/health").json()["database"] == "ok"
    assert "/api/v1/jobs" in client.get("/openapi.json").json()["paths"]


def test_space_exhaustion_finishes_a_task(client: TestClient, tokens: dict[str, str],
                                          toy_template: object) -> None:
    job_id = _run_job(client, tokens, target=TOY_TARGET, trials_per_task=50)
    task = client.get(f"/api/v1/jobs/{job_id}").json()["tasks"][0]
    assert task["status"] == "done" and task["trials_done"] == 5  # splits of 16 into 2
    assert "exhausted" in task["message"]


def test_records_round_trip_between_deployments(
        client: TestClient, tokens: dict[str, str], database_url: str, tmp_path: object,
        make_client: Callable[[Settings], TestClient]) -> None:
    _run_job(client, tokens)
    export = client.get("/api/v1/records", params={"target": "llvm"}).text
    # 4 trials, then the top configs re-measured before the best is stored (jobs.confirm)
    count = len(export.splitlines())
    assert count > 4 and sum(json.loads(line)["purpose"] == "tune"
                             for line in export.splitlines()) == 4
    later = client.get("/api/v1/records", params={"since": "2999-01-01T00:00:00+00:00"})
    assert later.status_code == 200 and later.text == ""
    other = make_client(_fresh_settings(tmp_path))
    other_tokens = _tokens(other)
    answer = other.post("/api/v1/records", content=export, headers=bearer(other_tokens))
    assert answer.json() == {"imported": count, "duplicates": 0}
    again = other.post("/api/v1/records", content=export, headers=bearer(other_tokens))
    assert again.json() == {"imported": 0, "duplicates": count}
    best = other.get("/api/v1/best", params={"workload": "dense:M=8,N=16,K=32"})
    assert best.status_code == 200
    lines = export.splitlines()
    broken = json.loads(lines[1])
    broken["config"] = {"index": 10**9}
    bad = "\n".join([lines[0], json.dumps(broken), "{not json"])
    answer = other.post("/api/v1/records", content=bad, headers=bearer(other_tokens))
    assert answer.status_code == 422
    assert [e["line"] for e in answer.json()["detail"]["errors"]] == [2, 3]


def test_cancel_stops_a_job(client: TestClient, tokens: dict[str, str]) -> None:
    answer = client.post("/api/v1/jobs", headers=bearer(tokens["user"]),
                         json={"workloads": ["dense:M=8,N=16,K=32"], "trials_per_task": 100})
    job_id = answer.json()["job_id"]
    cancelled = client.post(f"/api/v1/jobs/{job_id}/cancel", headers=bearer(tokens["user"]))
    assert cancelled.json()["status"] == "cancelled"
    assert FakeWorker(client, tokens["worker"]).claim(8) == []


def _fresh_settings(tmp_path: object) -> Settings:
    from pathlib import Path

    from tuner_service.db.migrate import upgrade

    url = f"sqlite:///{Path(str(tmp_path)) / 'other.db'}"
    upgrade(url)
    return Settings(database_url=url, data_dir=Path(str(tmp_path)) / "other",
                    driver_interval_s=0.05)


def _tokens(client: TestClient) -> str:
    from tuner_service import auth

    db = client.app.state.db  # type: ignore[attr-defined]
    with db.session() as session:
        return auth.create_token(session, "user")[1]
