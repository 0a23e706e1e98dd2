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


def test_candidates_start_with_the_default_and_are_distinct_valid_configs() -> None:
    key = "dense:M=16,N=64,K=64"
    workload = parse_workload(key)
    template = get_template(workload.op)
    space = template.space(workload)
    picks = weights_cold.candidates(key, 3)
    assert picks[0] == template.default_config(workload).index
    assert len(picks) == len(set(picks)) == 7
    assert all(space.is_valid(i) for i in picks)


def test_spearman_is_one_for_the_same_order_and_minus_one_reversed() -> None:
    a = weights_cold.np.array([1.0, 3.0, 2.0, 5.0])
    assert weights_cold.spearman(a, a * 2) == pytest.approx(1.0)
    assert weights_cold.spearman(a, -a) == pytest.approx(-1.0)


def test_a_ranking_row_reports_the_regret_of_the_warm_pick(
        monkeypatch: pytest.MonkeyPatch) -> None:
    times = iter([(1.0, 3.0), (2.0, 2.0), (3.0, 2.5)])  # warm-fastest is slowest flushed

    def fake(key: str, threads: int, config: dict[str, object] | None = None
             ) -> dict[str, object]:
        warm, flushed = next(times)
        return {"workload": key, "warm_ms": warm, "flushed_ms": flushed}

    monkeypatch.setattr(weights_cold, "measure", fake)
    monkeypatch.setattr(weights_cold, "candidates", lambda key, n: [0, 1, 2])
    row = weights_cold.ranking("dense:M=16,N=64,K=64", 1, 1)
    assert row["timed"] == 3 and not row["same_pick"]
    assert row["warm_pick_regret"] == pytest.approx(0.5)
    assert row["spearman_rho"] == pytest.approx(-0.5)
