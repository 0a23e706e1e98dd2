"""The search benchmark's replay machinery (bench/search_replay.py) and its stored dataset."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from schedule_templates.templates.base import get_template
from schedule_templates.workloads import parse_workload
from tuner_service.tuners import make_tuner

BENCH = Path(__file__).resolve().parents[2] / "bench"
KEY = "dense:M=64,N=64,K=64"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> dict[str, ModuleType]:
    monkeypatch.syspath_prepend(str(BENCH))
    import search_dataset
    import search_replay

    return {"replay": search_replay, "dataset": search_dataset}


def _replay(bench: dict[str, ModuleType], members: int = 60, seed: int = 0) -> Any:
    workload = parse_workload(KEY)
    space = get_template("dense").space(workload)
    chosen = space.sample(members, np.random.default_rng(seed))
    rng = np.random.default_rng(seed + 1)
    costs: dict[int, float | None] = {i: float(rng.uniform(1e-4, 1e-3)) for i in chosen}
    costs[chosen[0]] = None  # one recorded failure
    mod = bench["replay"]
    return workload, mod.Replay(mod.replay_space(space, chosen), costs, {chosen[0]: 5})


def test_the_replay_space_offers_only_measured_configs(bench: dict[str, ModuleType]) -> None:
    _, replay = _replay(bench)
    space, rng = replay.space, np.random.default_rng(3)
    members = set(replay.costs)
    assert set(space.sample(1000, rng)) == members
    assert all(space.random_index(rng) in members for _ in range(50))
    some = next(iter(members))
    assert set(space.neighbors(some)) <= members - {some} and len(list(space.neighbors(some)))
    outside = next(i for i in range(space.size) if i not in members)
    assert not space.is_valid(outside)
    assert space.nearest(outside, exclude=members - {some}) == [some]


def test_projection_never_repeats_a_config(bench: dict[str, ModuleType]) -> None:
    _, replay = _replay(bench)
    outside = [i for i in range(replay.space.size) if i not in replay.costs][:30]
    taken: set[int] = set()
    chosen, moved = replay.project(outside, taken)
    assert moved == 30 and len(set(chosen)) == 30 and set(chosen) <= set(replay.costs)


def test_a_random_search_replays_to_the_dataset_best(bench: dict[str, ModuleType]) -> None:
    workload, replay = _replay(bench)
    tuner = make_tuner("random", workload, replay.space, 0)
    trace = bench["replay"].run_search(tuner, replay, trials=1000, batch=8)
    curve = trace.best_fraction
    assert len(curve) == len(replay.costs) and trace.projected == 0
    assert all(a <= b for a, b in itertools.pairwise(curve))
    assert curve[-1] == pytest.approx(1.0)
    assert trace.trials_to(1.0) == next(t for t, v in enumerate(curve, 1) if v >= 1.0)
    failed = replay.results([next(i for i, c in replay.costs.items() if c is None)])[0]
    assert not failed.ok and failed.mean_cost == math.inf


def test_the_stored_dataset_matches_the_templates(bench: dict[str, ModuleType]) -> None:
    data = bench["dataset"].load_datasets()  # raises if a template's space changed
    if not data:
        pytest.skip("no replay dataset stored (python bench/search_dataset.py)")
    for item in data:
        ok = [r for r in item.records if r.cost is not None]
        assert item.header["threads"] == 1 and item.header["host"]["cpu_model"]
        assert len(ok) > len(item.records) // 2
        assert all(r.fastest is not None and r.fastest <= r.cost * (1 + 1e-5) for r in ok)
