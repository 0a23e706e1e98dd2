"""Task schedulers as pure strategies: budgets, warm-up, weights, gains, early stopping."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from tuner_service.jobs.scheduler import (
    GradientScheduler,
    RoundRobinScheduler,
    TaskLoad,
    TaskScheduler,
    best_curve,
    make_scheduler,
    scheduler_names,
    trials_without_gain,
)

SCHEDULERS: list[Callable[[], TaskScheduler]] = [
    RoundRobinScheduler, lambda: GradientScheduler(seed=3)]


@pytest.mark.parametrize("make", SCHEDULERS)
def test_allocations_respect_capacity_budget_and_batch(make: Callable[[], TaskScheduler]
                                                       ) -> None:
    rng = np.random.default_rng(0)
    scheduler = make()
    for _ in range(300):
        loads = []
        for _ in range(int(rng.integers(1, 6))):
            curve = best_curve(math.inf, list(rng.uniform(1e-3, 1e-2, int(rng.integers(0, 20)))))
            loads.append(TaskLoad(int(rng.integers(0, 30)), int(rng.integers(0, 9)),
                                  float(rng.integers(1, 4)), 1e6, tuple(curve)))
        capacity, batch = int(rng.integers(0, 20)), int(rng.integers(1, 9))
        out = scheduler.allocate(loads, capacity, batch)
        assert sum(n for _, n in out) <= max(0, capacity)
        assert len({p for p, _ in out}) == len(out)  # one entry per task
        for position, n in out:
            load = loads[position]
            assert 0 < n <= load.remaining and load.in_flight + n <= batch


def test_tasks_without_results_are_served_first() -> None:
    measured = TaskLoad(50, 0, weight=100.0, flops=1e9, curve=(1e-2, 5e-3))
    fresh = TaskLoad(50, 0, weight=1.0, flops=1e6)
    out = GradientScheduler(epsilon=0.0).allocate([measured, fresh], 8, 8)
    assert out == [(1, 8)]


def _simulate(scheduler: TaskScheduler, starts: list[float], floors: list[float],
              rates: list[float], weights: list[float], trials: int, batch: int = 8) -> float:
    """Run tasks whose best latency decays from ``start`` to ``floor`` at ``rate`` per trial;
    return the weighted end-to-end latency after ``trials`` in total."""
    curves: list[list[float]] = [[] for _ in starts]
    spent = 0
    while spent < trials:
        loads = [TaskLoad(10_000, 0, weights[i], 1e8, tuple(curves[i]))
                 for i in range(len(starts))]
        for position, n in scheduler.allocate(loads, batch, batch):
            for _ in range(n):
                t = len(curves[position]) + 1
                value = floors[position] + (starts[position] - floors[position]) * math.exp(
                    -rates[position] * t)
                curves[position].append(value)
            spent += n
    return sum(w * c[-1] for w, c in zip(weights, curves, strict=True))


def test_gradient_beats_round_robin_on_end_to_end_latency() -> None:
    # one heavy task that keeps improving, three light ones that converge at once
    args = ([50e-3, 2e-3, 2e-3, 2e-3], [5e-3, 1.9e-3, 1.9e-3, 1.9e-3],
            [0.02, 0.5, 0.5, 0.5], [3.0, 1.0, 1.0, 1.0], 256)
    gradient = _simulate(GradientScheduler(epsilon=0.0), *args)
    round_robin = _simulate(RoundRobinScheduler(), *args)
    assert gradient < 0.8 * round_robin


def test_weight_and_latency_drive_the_choice() -> None:
    scheduler = GradientScheduler(epsilon=0.0)
    curve = (4e-3, 3e-3, 2e-3, 2e-3)
    light, heavy = TaskLoad(64, 0, 1.0, 1e8, curve), TaskLoad(64, 0, 5.0, 1e8, curve)
    assert scheduler.allocate([light, heavy], 8, 8) == [(1, 8)]
    slow = TaskLoad(64, 0, 1.0, 1e8, tuple(10 * c for c in curve))
    assert scheduler.allocate([light, slow], 8, 8) == [(1, 8)]
    assert scheduler.gain(heavy) == pytest.approx(5 * scheduler.gain(light))


def test_a_similar_task_faster_per_flop_raises_the_estimate() -> None:
    scheduler = GradientScheduler(epsilon=0.0)
    lagging = TaskLoad(64, 0, 1.0, 1e9, (1.0,) * 40, group="conv2d.x86")
    fast = TaskLoad(64, 0, 1.0, 1e9, (1e-2,) * 40, group="conv2d.x86")
    alone = scheduler.gain(lagging, {})
    assert scheduler.gain(lagging, scheduler._group_throughput([lagging, fast])) > alone


def test_epsilon_picks_are_seeded() -> None:
    loads = [TaskLoad(1000, 0, float(w), 1e8, (1e-3 * w,) * 5) for w in range(1, 6)]

    def picks(seed: int) -> list[int]:
        s = GradientScheduler(epsilon=0.5, seed=seed)
        return [s.allocate(loads, 8, 8)[0][0] for _ in range(50)]

    assert picks(1) == picks(1)
    assert len(set(picks(1))) > 1  # exploration reaches other tasks


def test_trials_without_gain() -> None:
    inf = math.inf
    assert trials_without_gain([], 0.01) == 0
    assert trials_without_gain([inf, inf, inf], 0.01) == 3
    assert trials_without_gain([inf, 5.0, 5.0, 5.0], 0.01) == 2
    # a gain under min_gain does not reset the window; a larger one does
    assert trials_without_gain([5.0, 4.99, 4.98, 4.97], 0.01) == 3
    assert trials_without_gain([5.0, 4.99, 4.0, 4.0], 0.01) == 1


@pytest.mark.parametrize("make", [RoundRobinScheduler, GradientScheduler])
def test_early_stop_window(make: Callable[..., TaskScheduler]) -> None:
    scheduler = make(early_stop=4)
    improving = TaskLoad(10, 0, curve=tuple(best_curve(math.inf, [5, 4, 3, 2, 1])))
    stalled = TaskLoad(10, 0, curve=tuple(best_curve(math.inf, [5, 2, 3, 4, 5, 6])))
    assert not scheduler.should_stop(improving)
    assert scheduler.should_stop(stalled)
    assert not make().should_stop(stalled)  # 0 disables early stopping


def test_make_scheduler() -> None:
    assert scheduler_names() == ["gradient", "round-robin"]
    assert isinstance(make_scheduler("round-robin", early_stop=3), RoundRobinScheduler)
    scheduler = make_scheduler(early_stop=7)
    assert isinstance(scheduler, GradientScheduler) and scheduler.early_stop == 7
    with pytest.raises(ValueError, match="unknown task scheduler"):
        make_scheduler("fifo")
    with pytest.raises(ValueError):
        GradientScheduler(early_stop=-1)
