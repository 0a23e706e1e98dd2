"""Task schedulers: how a job's measurement slots are shared among its tasks.

A scheduler is a strategy only (no database, no timing): given each task's remaining budget,
what it has in flight and how its best latency evolved, it says how many new configs to ask from
which task's tuner, and whether a task has stopped improving (early stopping).

The job's objective is the model's end-to-end latency, sum over tasks of weight x best latency.
``GradientScheduler`` gives the next batch to the task whose next trials are expected to cut that
sum most (the idea of Ansor's task scheduler, Zheng et al., OSDI 2020): a blend of the task's
recent improvement per trial and an optimistic estimate of what is still to gain, scaled by the
task's weight. Tasks that have no result yet go first.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class TaskLoad:
    remaining: int  # trials of budget not yet measured or in flight
    in_flight: int
    weight: float = 1.0  # how often the task runs in one inference of the model
    flops: float = 0.0  # of one run of the task's workload
    #: best latency (seconds) after each measured trial, ``inf`` until one succeeded
    curve: tuple[float, ...] = ()
    #: tasks of one group (same operator and template) lend each other throughput estimates
    group: str = ""

    @property
    def best(self) -> float:
        return self.curve[-1] if self.curve else math.inf


def best_curve(previous: float, costs: Sequence[float]) -> list[float]:
    """The running best after each of ``costs`` (``inf`` for a failed trial)."""
    out = []
    for cost in costs:
        previous = min(previous, cost)
        out.append(previous)
    return out


def trials_without_gain(curve: Sequence[float], min_gain: float) -> int:
    """Trials since the best last improved by at least ``min_gain`` (a fraction) over the best
    it had then; every trial counts when none has succeeded."""
    anchor, last = math.inf, -1
    for position, best in enumerate(curve):
        if best < anchor * (1.0 - min_gain) or (anchor == math.inf and best < math.inf):
            anchor, last = best, position
    return len(curve) - 1 - last


class TaskScheduler(ABC):
    """``early_stop`` > 0 ends a task once its best has not improved by ``min_gain`` (a
    fraction) for that many measured trials; 0 never stops a task before its budget."""

    def __init__(self, early_stop: int = 0, min_gain: float = 0.01) -> None:
        if early_stop < 0 or not 0.0 <= min_gain < 1.0:
            raise ValueError("early_stop must be >= 0 and min_gain in [0, 1)")
        self.early_stop = early_stop
        self.min_gain = min_gain

    @abstractmethod
    def allocate(self, tasks: Sequence[TaskLoad], capacity: int, batch_size: int
                 ) -> list[tuple[int, int]]:
        """(task position, how many to ask) pairs using at most ``capacity`` slots in total;
        a task never gets more than its remaining budget or more than ``batch_size`` in flight."""

    def should_stop(self, task: TaskLoad) -> bool:
        """Whether a task has stalled for the early-stopping window."""
        return self.early_stop > 0 and \
            trials_without_gain(task.curve, self.min_gain) >= self.early_stop


def _want(load: TaskLoad, batch_size: int, capacity: int) -> int:
    return min(batch_size - load.in_flight, load.remaining, capacity)


class RoundRobinScheduler(TaskScheduler):
    """Gives a batch to each task in turn, starting after the last task served."""

    def __init__(self, early_stop: int = 0, min_gain: float = 0.01) -> None:
        super().__init__(early_stop, min_gain)
        self._cursor = 0

    def allocate(self, tasks: Sequence[TaskLoad], capacity: int, batch_size: int
                 ) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        count, start = len(tasks), self._cursor
        for step in range(count):
            if capacity <= 0:
                break
            position = (start + step) % count
            want = _want(tasks[position], batch_size, capacity)
            if want > 0:
                out.append((position, want))
                capacity -= want
                self._cursor = (position + 1) % count
        return out


class GradientScheduler(TaskScheduler):
    """Serves tasks in order of expected end-to-end latency saved per trial.

    ``window``: trials over which the recent improvement rate is read; ``alpha``: weight of
    that rate against the optimistic estimate; ``beta``: how far below a similar task's
    throughput this one is assumed reachable; ``epsilon``: share of batches given to a random
    task, so that an estimate that went wrong cannot starve a task forever.
    """

    def __init__(self, early_stop: int = 0, min_gain: float = 0.01, window: int = 16,
                 alpha: float = 0.2, beta: float = 2.0, epsilon: float = 0.05,
                 seed: int = 0) -> None:
        super().__init__(early_stop, min_gain)
        if window < 1 or not 0.0 <= alpha <= 1.0 or beta <= 0.0 or not 0.0 <= epsilon <= 1.0:
            raise ValueError("invalid gradient scheduler parameters")
        self.window, self.alpha, self.beta, self.epsilon = window, alpha, beta, epsilon
        self._rng = np.random.default_rng(seed)

    def allocate(self, tasks: Sequence[TaskLoad], capacity: int, batch_size: int
                 ) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        throughput = self._group_throughput(tasks)
        candidates = [p for p, load in enumerate(tasks) if _want(load, batch_size, 1) > 0]
        while candidates and capacity > 0:
            position = self._pick(tasks, candidates, throughput)
            candidates.remove(position)
            want = _want(tasks[position], batch_size, capacity)
            out.append((position, want))
            capacity -= want
        return out

    def _pick(self, tasks: Sequence[TaskLoad], candidates: list[int],
              throughput: dict[str, float]) -> int:
        fresh = [p for p in candidates if not tasks[p].curve]
        if fresh:  # warm-up: every task is measured once before estimates are compared
            return min(fresh, key=lambda p: (tasks[p].in_flight, p))
        if self._rng.random() < self.epsilon:
            return candidates[int(self._rng.integers(len(candidates)))]
        return max(candidates, key=lambda p: (self.gain(tasks[p], throughput), -p))

    def gain(self, task: TaskLoad, throughput: dict[str, float] | None = None) -> float:
        """Expected end-to-end latency saved per trial spent on ``task`` (seconds)."""
        t, best = len(task.curve), task.best
        if best == math.inf:
            # nothing valid yet: its share of the model is unknown, so rank it first
            return math.inf
        back = task.curve[max(0, t - 1 - self.window)]
        span = min(self.window, t - 1)
        recent = (min(back, 2.0 * best) - best) / span if span > 0 else 0.0
        optimistic = best / t  # as if the trials so far had been linear progress from zero
        group_rate = (throughput or {}).get(task.group, 0.0)
        if task.flops > 0 and group_rate > 0:
            # a similar task reached ``group_rate`` FLOP/s; within a factor ``beta`` is plausible
            reachable = task.flops / (group_rate / self.beta)
            optimistic = max(optimistic, (best - reachable) / max(1, self.window))
        return task.weight * (self.alpha * recent + (1.0 - self.alpha) * optimistic)

    @staticmethod
    def _group_throughput(tasks: Sequence[TaskLoad]) -> dict[str, float]:
        """Best FLOP/s reached by any task of each group."""
        out: dict[str, float] = {}
        for task in tasks:
            if task.flops > 0 and task.best < math.inf:
                out[task.group] = max(out.get(task.group, 0.0), task.flops / task.best)
        return out


#: name -> factory(early_stop, seed)
_SCHEDULERS: dict[str, Callable[[int, int], TaskScheduler]] = {
    "gradient": lambda early_stop, seed: GradientScheduler(early_stop=early_stop, seed=seed),
    "round-robin": lambda early_stop, seed: RoundRobinScheduler(early_stop=early_stop),
}


def scheduler_names() -> list[str]:
    return sorted(_SCHEDULERS)


def make_scheduler(name: str = "gradient", early_stop: int = 0, seed: int = 0) -> TaskScheduler:
    try:
        factory = _SCHEDULERS[name]
    except KeyError:
        raise ValueError(f"unknown task scheduler {name!r}; choose from "
                         f"{', '.join(scheduler_names())}") from None
    return factory(early_stop, seed)
