"""A worker over HTTP that reports a device class and costs from a function of the config
index (what a real worker on that hardware would send), for the device-class tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .fakes import bearer

ZEN4 = "cpu:amd:zen4:x86-64-v4:amd-epyc-9r14:2c"
ZEN4_BIG = "cpu:amd:zen4:x86-64-v4:amd-epyc-9654:96c"
ZEN5 = "cpu:amd:zen5:x86-64-v4:amd-epyc-9r45:2c"
SPR = "cpu:intel:sapphirerapids:x86-64-v4:intel-xeon-platinum-8480:56c"
GRAVITON = "cpu:arm:neoverse-v1:armv8-sve:arm-neoverse-v1:64c"

Costs = Callable[[int], list[float]]


class ClassWorker:
    """Registers with ``device_class`` in its hardware and reports ``costs(config index)``."""

    def __init__(self, client: Any, token: str, device_class: str, costs: Costs,
                 device_key: str = "local", target: str = "llvm", threads: int = 1,
                 noisy: bool | Callable[[int], bool] = False,
                 fails: Callable[[int, int], bool] = lambda _measure, _index: False) -> None:
        self.client = client
        self.headers = bearer(token)
        self.device_class = device_class
        self.costs = costs
        self.threads = threads
        #: report every result (or those whose measure id it accepts) as taken while busy
        self.noisy = noisy
        #: (measure id, config index) -> report that measurement as a runtime error
        self.fails = fails
        answer = client.post("/api/v1/workers/register", headers=self.headers, json={
            "device_key": device_key, "target": target, "name": device_class,
            "hardware": {"device_class": {"id": device_class}}, "software": {}})
        assert answer.status_code == 201, answer.text
        self.worker_id = answer.json()["worker_id"]
        #: (measure id, config index, purpose-free) in the order they were measured
        self.measured: list[tuple[int, int]] = []

    def _url(self, call: str) -> str:
        return f"/api/v1/workers/{self.worker_id}/{call}"

    def step(self, max_items: int = 8) -> int:
        answer = self.client.post(self._url("claim"), headers=self.headers,
                                  json={"max_items": max_items, "wait_s": 0.3})
        assert answer.status_code == 200, answer.text
        items = answer.json()["items"]
        if not items:
            return 0
        results = []
        for item in items:
            index = item["config"]["index"]
            noisy = self.noisy(item["measure_id"]) if callable(self.noisy) else self.noisy
            self.measured.append((item["measure_id"], index))
            failed = self.fails(item["measure_id"], index)
            results.append({"measure_id": item["measure_id"],
                            "costs": [] if failed else self.costs(index),
                            "error_kind": 4 if failed else 0,
                            "error_message": "crashed" if failed else "",
                            "device_class": self.device_class,
                            "threads": self.threads, "noisy": noisy,
                            "load": 1.0 if noisy else 0.0})
        answer = self.client.post(self._url("results"), headers=self.headers,
                                  json={"results": results})
        assert answer.status_code == 200, answer.text
        return len(items)

    def run_until_done(self, job_id: int, timeout_s: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.step()
            status = self.client.get(f"/api/v1/jobs/{job_id}").json()
            if status["status"] in ("done", "failed", "cancelled"):
                return dict(status)
        raise AssertionError(f"job {job_id} did not finish in {timeout_s}s")


def submit(client: Any, token: str, workloads: list[str], trials: int,
           device_key: str = "local", threads: int | None = None) -> int:
    body: dict[str, Any] = {"workloads": workloads, "trials_per_task": trials,
                            "tuner": "random", "device_key": device_key}
    if threads is not None:
        body["threads"] = threads
    answer = client.post("/api/v1/jobs", headers=bearer(token), json=body)
    assert answer.status_code == 201, answer.text
    return int(answer.json()["job_id"])
