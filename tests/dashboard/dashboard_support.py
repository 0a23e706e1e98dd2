"""Helpers for the dashboard tests: a worker double speaking the worker protocol over HTTP
(a TestClient or an httpx.Client) with synthetic results, and job submission."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

WORKLOADS = ["dense:M=8,N=16,K=32", "conv2d:N=1,C=8,H=8,W=8,K=8,R=3,S=3,pad=1"]


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


class ProtocolWorker:
    """Registers, claims and reports over HTTP (a TestClient or an httpx.Client)."""

    def __init__(self, client: Any, token: str, peak_gflops: float | None = None) -> None:
        self.client, self.headers, self.peak = client, bearer(token), peak_gflops
        answer = client.post("/api/v1/workers/register", headers=self.headers, json={
            "device_key": "local", "target": "llvm", "name": "protocol-double",
            "hardware": {"cpu_model": "test cpu", "threads": 1}, "software": {"backend": "fake"}})
        assert answer.status_code == 201, answer.text
        self.worker_id = answer.json()["worker_id"]

    def claim(self, max_items: int, wait_s: float = 2.0) -> list[dict[str, Any]]:
        answer = self.client.post(f"/api/v1/workers/{self.worker_id}/claim", headers=self.headers,
                                  json={"max_items": max_items, "wait_s": wait_s})
        assert answer.status_code == 200, answer.text
        items: list[dict[str, Any]] = answer.json()["items"]
        return items

    def claim_at_least(self, count: int, timeout_s: float = 20.0) -> list[dict[str, Any]]:
        """The driver queues work in batches: claim until ``count`` items are held."""
        items: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while len(items) < count:
            assert time.monotonic() < deadline, f"only {len(items)} of {count} items queued"
            items += self.claim(count - len(items), wait_s=1.0)
        return items

    def report(self, items: list[dict[str, Any]], errors: int = 0) -> list[int]:
        """Report ``items``; the first ``errors`` of them as runtime errors. Returns the ids."""
        results = []
        for n, item in enumerate(items):
            index = int(item["config"]["index"])
            if n < errors:
                result = {"costs": [], "error_kind": 4, "error_message": f"crashed ({index})"}
            else:
                cost = 1e-5 * (1.0 + (index * 7919) % 101 / 50.0)
                result = {"costs": [cost, cost], "error_kind": 0, "error_message": ""}
            results.append({"measure_id": item["measure_id"], **result,
                            "compile_time_s": 0.01, "wall_time_s": 0.02,
                            "peak_gflops": self.peak})
        answer = self.client.post(f"/api/v1/workers/{self.worker_id}/results",
                                  headers=self.headers, json={"results": results})
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["accepted"]) == len(items), answer.text
        return [item["measure_id"] for item in items]


    def finish(self, job_id: int, timeout_s: float = 30.0) -> None:
        """Measure whatever the job still queues (its best configs are re-measured before
        they are stored) until it is done."""
        deadline = time.monotonic() + timeout_s
        while self.client.get(f"/api/v1/jobs/{job_id}").json()["status"] != "done":
            assert time.monotonic() < deadline, "the job did not finish"
            items = self.claim(8, wait_s=0.5)
            if items:
                self.report(items)


def submit(client: Any, token: str, trials: int, workloads: list[str] | None = None) -> int:
    answer = client.post("/api/v1/jobs", headers=bearer(token), json={
        "workloads": workloads or WORKLOADS, "trials_per_task": trials})
    assert answer.status_code == 201, answer.text
    return int(answer.json()["job_id"])


@contextlib.contextmanager
def serve(settings: Any) -> Iterator[str]:
    """The app under uvicorn on a free loopback port, for as long as the block runs."""
    import uvicorn

    from tuner_service.app import create_app

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
