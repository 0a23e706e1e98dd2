"""A job given as workloads runs to completion with a fake worker; configs come back."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from .fakes import FakeWorker, bearer


def test_job_runs_to_completion(client: TestClient, tokens: dict[str, str]) -> None:
    answer = client.post("/api/v1/jobs", headers=bearer(tokens["user"]), json={
        "workloads": ["dense:M=16,N=32,K=64", "dense:M=8,N=16,K=32"],
        "target": "llvm", "device_key": "local", "trials_per_task": 6, "tuner": "random"})
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["job_id"]
    status = FakeWorker(client, tokens["worker"]).run_until_done(job_id)
    assert status["status"] == "done", status
    assert [t["trials_done"] for t in status["tasks"]] == [6, 6]
    assert all(t["best_gflops"] > 0 for t in status["tasks"])
    configs = client.get(f"/api/v1/jobs/{job_id}/configs").json()
    assert all(t["config"]["entity"] for t in configs["tasks"])
    lines = client.get(f"/api/v1/jobs/{job_id}/configs?format=autotvm").text.splitlines()
    record = json.loads(lines[0])
    assert record["version"] == 0.2 and record["input"][0] == "llvm"
    best = client.get("/api/v1/best", params={"workload": "dense:M=16,N=32,K=64",
                                               "target": "llvm"})
    assert best.status_code == 200, best.text
