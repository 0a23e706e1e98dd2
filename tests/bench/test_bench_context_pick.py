"""bench/context_pick.py: each task's fastest trials plus the default, timed warm and flushed; the
picks by each, and configs files ``tuner build`` reads (timings faked except for one real run)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import context_pick as cp
import job_convergence as jc
import weights_cold

from schedule_templates.records import MeasureResult
from schedule_templates.templates.base import get_template
from schedule_templates.workloads import parse_workload
from tuner_service.compiler.deploy.configs import load_configs_file

KEY = "dense:M=16,N=64,K=64"


def configs(n: int) -> list[dict[str, Any]]:
    """``n`` distinct valid configs of KEY that are not its default."""
    workload = parse_workload(KEY)
    template = get_template(workload.op)
    space = template.space(workload)
    default = template.default_config(workload).index
    picked = [i for i in range(space.size) if space.is_valid(i) and i != default][:n]
    return [space.get(i).to_json() for i in picked]


def test_job_tasks_keep_each_tasks_fastest_distinct_successful_configs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, c = configs(3)
    trials = [jc.Trial(1, KEY, "dense.x86", 1, a, 1.0, 3e-3),
              jc.Trial(1, KEY, "dense.x86", 1, b, 2.0, 1e-3),
              jc.Trial(1, KEY, "dense.x86", 1, a, 3.0, 2e-3),  # a again, faster this time
              jc.Trial(1, KEY, "dense.x86", 1, c, 4.0, None),  # failed
              jc.Trial(2, "dense:M=1,N=64,K=64", "dense.x86", 1, a, 5.0, None)]
    monkeypatch.setattr(cp, "read_trials", lambda db, job, started: trials)
    tasks = cp.job_tasks(Path("unused.db"), 1, top=3)
    assert [t["workload"] for t in tasks] == [KEY, "dense:M=1,N=64,K=64"]
    assert tasks[0]["configs"] == [b, a]
    assert tasks[1]["configs"] == []


def test_picks_by_warm_and_by_flushed_time_and_the_regret(
        monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = configs(2)
    workload = parse_workload(KEY)
    default = get_template(workload.op).default_config(workload).to_json()
    # (warm ms, flushed ms): a is fastest warm but slowest flushed; b is fastest flushed
    times = {json.dumps(default, sort_keys=True): (2.0, 2.5),
             json.dumps(a, sort_keys=True): (1.0, 3.0),
             json.dumps(b, sort_keys=True): (1.5, 2.0)}

    def fake(key: str, template: str, config: dict[str, Any], target: str, options: Any,
             threads: int) -> MeasureResult:
        warm, flushed = times[json.dumps(config, sort_keys=True)]
        cost = (flushed if options.flush_cache else warm) / 1e3
        return MeasureResult(costs=(cost, cost * 1.1))

    monkeypatch.setattr(weights_cold, "measure_candidate", fake)
    row = cp.pick({"workload": KEY, "template": "dense.x86", "configs": [a, b, default]}, 1,
                  rounds=2)
    assert [c["config"] for c in row["candidates"]] == [default, a, b]  # default first, once
    assert row["warm_pick"]["config"] == a and row["flushed_pick"]["config"] == b
    assert not row["same_pick"]
    assert row["warm_pick_regret_ms"] == pytest.approx(1.0, rel=0.06)
    assert row["default_flushed_ms"] == pytest.approx(2.5, rel=0.06)


def test_configs_files_are_what_tuner_build_reads(tmp_path: Path) -> None:
    a, b = configs(2)
    rows = [{"workload": KEY, "template": "dense.x86",
             "warm_pick": {"config": a, "warm_ms": 1.0, "flushed_ms": 3.0},
             "flushed_pick": {"config": b, "warm_ms": 1.5, "flushed_ms": 2.0}}]
    for which, config, cost in (("warm_pick", a, 1e-3), ("flushed_pick", b, 2e-3)):
        path = tmp_path / f"{which}.json"
        path.write_text(json.dumps(cp.configs_file(rows, which, 2)))
        book = load_configs_file(path)
        (entry,) = book.entries()
        assert entry.config == config and entry.mean_cost == pytest.approx(cost)
        assert book.threads == 2


def test_a_small_dense_is_timed_both_ways_for_real(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weights_cold, "WARM", dataclasses.replace(weights_cold.WARM, repeat=2,
                                                                  min_repeat_ms=0.5))
    monkeypatch.setattr(weights_cold, "FLUSHED", dataclasses.replace(weights_cold.FLUSHED,
                                                                     repeat=2))
    (row,) = cp.time_both(KEY, configs(1), 1, rounds=1)
    assert row["warm_ms"] > 0 and row["flushed_ms"] > 0
