"""A job that cannot progress says why (``health``): no worker online, or every recent result
failed; the REST status and the dashboard snapshot both carry it, and it clears on progress."""

from __future__ import annotations

import time
from typing import Any

from fastapi.testclient import TestClient

from tests.server.fakes import FakeWorker, bearer
from tuner_service.jobs.health import FAILING_AFTER


def _health(client: TestClient, job_id: int) -> Any:
    status = client.get(f"/api/v1/jobs/{job_id}").json()
    snapshot = client.get(f"/api/v1/dashboard/jobs/{job_id}").json()
    assert snapshot["health"] == status["health"]
    return status["health"]


def _report(worker: FakeWorker, items: list[dict[str, Any]], ok: bool) -> None:
    results = [{"measure_id": i["measure_id"], "costs": [1e-4] * 3 if ok else [],
                "error_kind": 0 if ok else 4,
                "error_message": "" if ok else "child killed by SIGSEGV",
                "compile_time_s": 0.01, "wall_time_s": 0.02, "peak_gflops": None}
               for i in items]
    answer = worker.client.post(worker.url("results"), headers=worker.headers,
                                json={"results": results})
    assert answer.status_code == 200, answer.text


def _claim(worker: FakeWorker, n: int) -> list[dict[str, Any]]:
    """Up to ``n`` queued items (at least one): the driver keeps only a few in flight."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        items = {i["measure_id"]: i for i in worker.claim(n, wait_s=0.3)}
        if items:
            return list(items.values())[:n]
    raise AssertionError("nothing to claim")


def _fail(worker: FakeWorker, count: int) -> None:
    failed = 0
    while failed < count:
        items = _claim(worker, count - failed)
        _report(worker, items, ok=False)
        failed += len(items)


def test_no_worker_then_failing_then_healthy(client: TestClient, tokens: dict[str, str]) -> None:
    answer = client.post("/api/v1/jobs", headers=bearer(tokens["user"]), json={
        "workloads": ["dense:M=8,N=16,K=32"], "trials_per_task": 32, "tuner": "random",
        "device_key": "local"})
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["job_id"]

    health = _health(client, job_id)
    assert health["state"] == "no_workers"
    assert "'local'" in health["message"] and "tuner worker" in health["message"]

    worker = FakeWorker(client, tokens["worker"])
    assert _health(client, job_id) is None  # a worker is online, nothing failed yet
    _fail(worker, FAILING_AFTER - 1)
    assert _health(client, job_id) is None  # not yet every one of the last FAILING_AFTER
    _fail(worker, 1)
    health = _health(client, job_id)
    assert health["state"] == "failing"
    assert "runtime error" in health["message"] and "SIGSEGV" in health["message"]

    _report(worker, _claim(worker, 1), ok=True)
    assert _health(client, job_id) is None
