"""Tuners that learn nothing: uniform random sampling and a grid walk in index order."""

from __future__ import annotations

from schedule_templates.space import ConfigSpace
from schedule_templates.workloads import Workload
from tuner_service.tuners.base import Tuner


class RandomTuner(Tuner):
    def _propose(self, n: int) -> list[int]:
        return self.space.sample(n, self.rng, exclude=self.visited)


class GridTuner(Tuner):
    """Walks the space in index order, skipping configs the template filters out."""

    def __init__(self, workload: Workload, space: ConfigSpace, seed: int = 0) -> None:
        super().__init__(workload, space, seed)
        self._cursor = 0

    def _propose(self, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n and self._cursor < self.space.size:
            i = self._cursor
            self._cursor += 1
            if i not in self.visited and self.space.is_valid(i):
                out.append(i)
        return out
