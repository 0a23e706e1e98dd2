"""bench/weights_cold.py: its layers are real workloads, and one small layer is timed both ways."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import weights_cold

from schedule_templates.templates.base import get_template
from schedule_templates.workloads import parse_workload


@pytest.mark.parametrize("key", weights_cold.LAYERS)
def test_each_default_layer_has_a_template_and_a_default(key: str) -> None:
    workload = parse_workload(key)
    assert get_template(workload.op).default_config(workload) is not None


def test_a_small_dense_is_timed_warm_and_flushed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weights_cold, "WARM", dataclasses.replace(weights_cold.WARM, repeat=3,
                                                                  min_repeat_ms=1.0))
    monkeypatch.setattr(weights_cold, "FLUSHED", dataclasses.replace(weights_cold.FLUSHED,
                                                                     repeat=2))
    row = weights_cold.measure("dense:M=16,N=64,K=64", 1)
    assert row["warm_ms"] > 0 and row["flushed_ms"] > 0
    assert row["flushed_over_warm"] == pytest.approx(row["flushed_ms"] / row["warm_ms"],
                                                     rel=1e-2)
