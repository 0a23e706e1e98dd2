"""Replaying searches against the recorded dataset: a space restricted to the measured configs,
a tuner driven by ask/tell with recorded results, and the trial counts the benchmark reports.

A tuner in replay may only measure configs that were measured. ``ReplaySpace`` is the full
template space (same knobs, same indices, same features) whose sampling draws uniformly among
the measured configs. With ``strict`` (random and model-based search) only measured configs are
valid: the model-based tuner then ranks all of them (the limit its annealing approximates in the
full space). Without it (the genetic tuner, whose children are built knob by knob and would
almost never land on a measured config of a large space) every config of the template is
valid, and a child outside the measured set is replaced by the nearest measured config in knob
space that was not proposed yet (``Replay.project``). Projections are counted and reported.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from schedule_templates.records import ErrorKind, MeasureResult
from schedule_templates.space import ConfigSpace


@dataclasses.dataclass(frozen=True)
class ReplaySpace(ConfigSpace):
    """A template space whose valid configs are ``members`` (the measured ones)."""

    members: tuple[int, ...] = ()
    #: only members are valid (else the template's own constraint decides)
    strict: bool = True
    #: how many nearest members ``neighbors`` yields
    fan_out: int = 8

    def __post_init__(self) -> None:
        members = np.array(sorted(set(self.members)), dtype=np.int64)
        digits = np.array([self.digits(int(i)) for i in members], dtype=np.float64)
        scale = np.maximum(np.array(self.dims, dtype=np.float64) - 1.0, 1.0)
        object.__setattr__(self, "_member_set", frozenset(members.tolist()))
        object.__setattr__(self, "_member_array", members)
        object.__setattr__(self, "_coords", digits / scale)

    def is_valid(self, index: int) -> bool:
        if index in self._member_set:  # type: ignore[attr-defined]
            return True
        return not self.strict and super().is_valid(index)

    def sample(self, n: int, rng: np.random.Generator, exclude: Iterable[int] = (),
               valid_only: bool = True, max_tries: int | None = None) -> list[int]:
        seen = set(exclude)
        pool = [int(i) for i in self._member_array if int(i) not in seen]  # type: ignore[attr-defined]
        picks = rng.permutation(len(pool))[:n]
        return [pool[p] for p in picks]

    def random_index(self, rng: np.random.Generator) -> int:
        members = self._member_array  # type: ignore[attr-defined]
        return int(members[int(rng.integers(len(members)))])

    def nearest(self, index: int, exclude: Iterable[int] = (), k: int = 1) -> list[int]:
        """The ``k`` measured configs closest to ``index`` in normalised knob positions."""
        point = np.array(self.digits(index), dtype=np.float64) / np.maximum(
            np.array(self.dims, dtype=np.float64) - 1.0, 1.0)
        distance = np.abs(self._coords - point).sum(axis=1)  # type: ignore[attr-defined]
        banned = set(exclude) | {index}
        out: list[int] = []
        for position in np.argsort(distance, kind="stable"):
            candidate = int(self._member_array[position])  # type: ignore[attr-defined]
            if candidate not in banned:
                out.append(candidate)
                if len(out) == k:
                    break
        return out

    def neighbors(self, index: int, step: int = 1) -> Iterator[int]:
        yield from self.nearest(index, k=self.fan_out * step)


def replay_space(space: ConfigSpace, members: Iterable[int], strict: bool = True
                 ) -> ReplaySpace:
    return ReplaySpace(space.knobs, space.constraint, members=tuple(members), strict=strict)


def result_of(cost: float | None, error: int) -> MeasureResult:
    """The recorded outcome as the tuner would have received it."""
    if cost is None:
        kind = ErrorKind(error) if error else ErrorKind.UNKNOWN
        return MeasureResult.failure(kind, "recorded failure")
    return MeasureResult(costs=(cost,))


@dataclasses.dataclass
class SearchTrace:
    """One replayed search: the best throughput (as a fraction of the dataset's best) after each
    trial, and how often a proposal had to be moved into the measured set."""

    best_fraction: list[float]
    projected: int
    tuner_s: float

    def trials_to(self, fraction: float) -> int | None:
        for trial, value in enumerate(self.best_fraction, start=1):
            if value >= fraction - 1e-12:
                return trial
        return None


class Replay:
    """Answers a tuner's proposals from the dataset of one workload."""

    def __init__(self, space: ReplaySpace, costs: dict[int, float | None],
                 errors: dict[int, int]) -> None:
        self.space = space
        self.loose = dataclasses.replace(space, strict=False)
        self.costs = costs
        self.errors = errors
        ok = [c for c in costs.values() if c is not None]
        self.best_cost = min(ok)

    def project(self, proposed: Sequence[int], taken: set[int]) -> tuple[list[int], int]:
        """Proposals moved into the measured set (never onto a config already taken)."""
        out: list[int] = []
        moved = 0
        for index in proposed:
            if index in self.costs and index not in taken:
                chosen = index
            else:
                moved += 1
                near = self.space.nearest(index, exclude=taken)
                if not near:
                    continue
                chosen = near[0]
            taken.add(chosen)
            out.append(chosen)
        return out, moved

    def results(self, indices: Sequence[int]) -> list[MeasureResult]:
        return [result_of(self.costs[i], self.errors.get(i, 0)) for i in indices]


def run_search(tuner: Any, replay: Replay, trials: int, batch: int) -> SearchTrace:
    """Ask/tell until ``trials`` configs are measured, the measured set is spent or its best
    config is found (nothing can change after that)."""
    import time

    best, moved, spent = math.inf, 0, 0.0
    curve: list[float] = []
    taken: set[int] = set()
    limit = min(trials, len(replay.costs))
    while len(curve) < limit:
        start = time.perf_counter()
        proposed = tuner.ask(min(batch, limit - len(curve)))
        spent += time.perf_counter() - start
        indices, shifted = replay.project(proposed, taken)
        moved += shifted
        if not indices:
            if not proposed:
                break
            continue
        tuner.exclude(indices)
        results = replay.results(indices)
        start = time.perf_counter()
        tuner.tell(indices, results)
        spent += time.perf_counter() - start
        for result in results:
            if result.ok:
                best = min(best, result.mean_cost)
            curve.append(replay.best_cost / best if best < math.inf else 0.0)
        if curve[-1] >= 1.0:  # found the dataset's best: the rest of the curve is flat
            curve += [1.0] * (limit - len(curve))
    return SearchTrace(curve, moved, spent)


@dataclasses.dataclass
class JobTask:
    """One task of a replayed job: its weight in the model, its data and its tuner."""

    weight: float
    flops: float
    replay: Replay
    tuner: Any
    group: str
    curve: list[float] = dataclasses.field(default_factory=list)
    taken: set[int] = dataclasses.field(default_factory=set)


def run_job(scheduler: Any, tasks: Sequence[JobTask], trials: int, batch: int) -> list[float]:
    """Share ``trials`` among ``tasks`` as the job driver would (one batch at a time); returns
    the model's latency, sum of weight x best, after each trial (inf until every task has a
    result), with every task budgeted the whole of ``trials``."""
    from tuner_service.jobs.scheduler import TaskLoad, best_curve

    latency: list[float] = []
    while len(latency) < trials:
        loads = [TaskLoad(len(t.replay.costs) - len(t.curve), 0, t.weight, t.flops,
                          tuple(t.curve), t.group) for t in tasks]
        plan = scheduler.allocate(loads, min(batch, trials - len(latency)), batch)
        if not plan:
            break
        for position, n in plan:
            task = tasks[position]
            indices, _ = task.replay.project(task.tuner.ask(n), task.taken)
            task.tuner.exclude(indices)
            results = task.replay.results(indices)
            task.tuner.tell(indices, results)
            task.curve += best_curve(task.curve[-1] if task.curve else math.inf,
                                     [r.mean_cost if r.ok else math.inf for r in results])
            for _ in indices:
                latency.append(sum(t.weight * (t.curve[-1] if t.curve else math.inf)
                                   for t in tasks))
    return latency
