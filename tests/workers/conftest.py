"""Fixtures for the worker tests: items and the stub server (the real server is exercised in
test_worker_e2e.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from schedule_templates.records import MeasureOptions
from workers.stub_server import StubServer

FAST = MeasureOptions(number=1, repeat=2, min_repeat_ms=0.0, build_timeout_s=3.0,
                      run_timeout_s=3.0)


def make_item(measure_id: int, index: int | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "measure_id": measure_id, "template": "dense.x86", "template_version": 1,
        "workload": "dense:M=64,N=64,K=64", "target": "llvm",
        "config": {"index": measure_id if index is None else index},
        "options": FAST.to_json(), "threads": 1, **extra,
    }


@pytest.fixture
def stub_server() -> Iterator[StubServer]:
    with StubServer() as server:
        yield server


__all__ = ["FAST", "StubServer", "make_item"]
