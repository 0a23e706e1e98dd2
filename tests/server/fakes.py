"""Test doubles for the server tests: a toy template with a tiny space, and a fake worker that
speaks the worker protocol over HTTP and reports synthetic timings."""

from __future__ import annotations

import time
from typing import Any

from schedule_templates.space import Config, ConfigSpace, SplitKnob
from schedule_templates.workloads import Workload

TOY_TARGET = "toy"


def toy_template_class() -> Any:
    from schedule_templates.templates.base import Template

    class ToyDense(Template):
        """A tiny space (splits of N into 2): small enough to exhaust in a test."""

        name = "dense.toy"
        op = "dense"
        target_kind = TOY_TARGET
        version = 1

        def space(self, workload: Workload, device: Any = None) -> ConfigSpace:
            return ConfigSpace((SplitKnob("tile_n", workload.N, 2),))  # type: ignore[attr-defined]

        def default_config(self, workload: Workload) -> Config:
            return self.space(workload).get(0)

        def lower(self, workload: Workload, config: Config) -> Any:
            raise NotImplementedError("the toy template is never built")

    return ToyDense


def synthetic_cost(index: int) -> float:
    """A deterministic fake latency per config index (seconds)."""
    return 1e-4 * (1.0 + (index * 7919) % 101 / 50.0)


def conv_model() -> Any:
    """A one-layer ONNX model (3x3 conv, 3 -> 4 channels at 8x8, seeded weight) for uploads."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).normal(size=(4, 3, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], "conv", pads=[1, 1, 1, 1])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        initializer=[numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


class FakeWorker:
    """Claims over HTTP and reports synthetic results (what a real worker would send)."""

    def __init__(self, client: Any, token: str, device_key: str = "local",
                 target: str = "llvm") -> None:
        self.client = client
        self.headers = bearer(token)
        answer = client.post("/api/v1/workers/register", headers=self.headers, json={
            "device_key": device_key, "target": target, "name": "fake",
            "hardware": {"cpu": "test"}, "software": {"python": "3"}})
        assert answer.status_code == 201, answer.text
        self.worker_id = answer.json()["worker_id"]

    def url(self, call: str) -> str:
        return f"/api/v1/workers/{self.worker_id}/{call}"

    def claim(self, max_items: int = 4, wait_s: float = 0.0) -> list[dict[str, Any]]:
        answer = self.client.post(self.url("claim"), headers=self.headers,
                                  json={"max_items": max_items, "wait_s": wait_s})
        assert answer.status_code == 200, answer.text
        items: list[dict[str, Any]] = answer.json()["items"]
        return items

    def report(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        results = [{"measure_id": i["measure_id"],
                    "costs": [synthetic_cost(i["config"]["index"])] * 3, "error_kind": 0,
                    "error_message": "", "compile_time_s": 0.01, "wall_time_s": 0.02,
                    "peak_gflops": None} for i in items]
        answer = self.client.post(self.url("results"), headers=self.headers,
                                  json={"results": results})
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body

    def run_until_done(self, job_id: int, timeout_s: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            items = self.claim(8, wait_s=0.3)
            if items:
                self.report(items)
            status = self.client.get(f"/api/v1/jobs/{job_id}").json()
            if status["status"] in ("done", "failed", "cancelled"):
                return dict(status)
        raise AssertionError(f"job {job_id} did not finish in {timeout_s}s")
