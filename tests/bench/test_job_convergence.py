"""bench/job_convergence.py's snapshots: the fastest successful trial per task by each time, as a
configs file ``tuner build`` reads (nothing is tuned or timed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import job_convergence as jc

from tuner_service.compiler.deploy.configs import load_configs_file

KEYS = {1: "dense:M=64,N=64,K=64", 2: "dense:M=1,N=1000,K=512"}


def trial(task: int, t_s: float, cost: float | None, tile: int = 1) -> jc.Trial:
    return jc.Trial(task, KEYS[task], "dense", 1, {"tile": tile}, t_s, cost)


TRIALS = [trial(1, 10, 3e-3, 1), trial(1, 20, 2e-3, 2), trial(1, 30, None, 3),
          trial(2, 15, 5e-3, 4), trial(1, 40, 2.5e-3, 5), trial(2, 50, 1e-3, 6)]


def test_best_by_keeps_the_fastest_successful_trial_stored_by_then() -> None:
    assert jc.best_by(TRIALS, 5) == {}
    assert {k: t.config["tile"] for k, t in jc.best_by(TRIALS, 15).items()} == {1: 1, 2: 4}
    assert {k: t.config["tile"] for k, t in jc.best_by(TRIALS, 45).items()} == {1: 2, 2: 4}
    assert {k: t.config["tile"] for k, t in jc.best_by(TRIALS, 60).items()} == {1: 2, 2: 6}


def test_configs_document_is_what_tuner_build_reads(tmp_path: Path) -> None:
    path = tmp_path / "configs.json"
    path.write_text(json.dumps(jc.configs_document(jc.best_by(TRIALS, 60), 7, 2)))
    entries = {e.workload: e for e in load_configs_file(path).entries()}
    assert set(entries) == set(KEYS.values())
    assert entries[KEYS[2]].config == {"tile": 6}
    assert entries[KEYS[1]].mean_cost == 2e-3


def test_snapshots_stop_at_the_end_of_the_job(tmp_path: Path) -> None:
    snaps = jc.snapshots(TRIALS, [40, 12, 30], 35, 7, 2, tmp_path)
    assert [(s.name, s.trials) for s in snaps] == [("0.2 min", 1), ("0.5 min", 4), ("end", 4)]
    assert all(s.configs.exists() for s in snaps)
    end = json.loads(snaps[-1].configs.read_text())["tasks"]
    assert [task["config"] for task in end] == [{"tile": 2}, {"tile": 4}]
