"""The genetic tuner (``ga``): measured configs breed the next proposals.

The population is the ``population`` fastest configs measured so far (failures have fitness 0
and are never parents while a success exists). A child takes every knob from one of two parents
picked with probability proportional to their throughput (uniform crossover), then each knob
mutates to a random value with probability ``mutation``. A child that fails the space's
constraint is repaired to its first valid neighbour (``ConfigSpace.neighbors``: one knob one
step away); children proposed before or repeated are discarded. When breeding stalls (a tiny or
nearly exhausted space) the batch is topped up with random configs. Until two configs have run,
proposals are random.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from schedule_templates.records import MeasureResult
from schedule_templates.space import ConfigSpace
from schedule_templates.workloads import Workload
from tuner_service.cost_model.metrics import throughputs
from tuner_service.tuners.base import Tuner


@dataclasses.dataclass(frozen=True)
class GAParams:
    population: int = 32
    mutation: float = 0.1
    #: breeding attempts per wanted child before falling back to random configs
    tries: int = 20


class GATuner(Tuner):
    def __init__(self, workload: Workload, space: ConfigSpace, seed: int = 0, *,
                 params: GAParams | None = None) -> None:
        super().__init__(workload, space, seed)
        self.params = params or GAParams()
        self._fitness: dict[int, float] = {}

    def _update(self, indices: Sequence[int], results: Sequence[MeasureResult]) -> None:
        for index, value in zip(indices, throughputs(results), strict=True):
            self._fitness[int(index)] = max(float(value), self._fitness.get(int(index), 0.0))

    def _parents(self) -> tuple[list[tuple[int, ...]], np.ndarray]:
        alive = sorted(((f, i) for i, f in self._fitness.items() if f > 0), reverse=True)
        alive = alive[: self.params.population]
        fitness = np.array([f for f, _ in alive])
        return [self.space.digits(i) for _, i in alive], fitness / max(fitness.sum(), 1e-300)

    def _propose(self, n: int) -> list[int]:
        parents, weights = self._parents()
        picks: list[int] = []
        if len(parents) >= 2:
            taken = set(self.visited)
            for _ in range(n * self.params.tries):
                if len(picks) == n:
                    break
                child = self._repair(self._breed(parents, weights), taken)
                if child is not None:
                    taken.add(child)
                    picks.append(child)
        return picks + self.space.sample(n - len(picks), self.rng,
                                         exclude=self._visited.union(picks))

    def _repair(self, child: int, taken: set[int]) -> int | None:
        if child not in taken and self.space.is_valid(child):
            return child
        return next((i for i in self.space.neighbors(child)
                     if i not in taken and self.space.is_valid(i)), None)

    def _breed(self, parents: list[tuple[int, ...]], weights: np.ndarray) -> int:
        a, b = self.rng.choice(len(parents), size=2, replace=False, p=weights)
        take_a = self.rng.random(len(self.space.dims)) < 0.5
        mutate = self.rng.random(len(self.space.dims)) < self.params.mutation
        digits = []
        for k, dim in enumerate(self.space.dims):
            d = parents[a][k] if take_a[k] else parents[b][k]
            digits.append(int(self.rng.integers(dim)) if mutate[k] else d)
        return self.space.index_of(digits)
