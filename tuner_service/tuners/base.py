"""The tuner contract: ``ask(n)`` proposes config indices, ``tell(indices, results)`` learns.

Tuners are strategies only: they never time, log-configure, write files or touch the database.
The loop that measures and records (local loop, server job driver) owns all of that.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from schedule_templates.records import MeasureResult
from schedule_templates.space import ConfigSpace
from schedule_templates.workloads import Workload


class Tuner(ABC):
    def __init__(self, workload: Workload, space: ConfigSpace, seed: int = 0) -> None:
        self.workload = workload
        self.space = space
        self.rng = np.random.default_rng(seed)
        #: every index proposed so far (measured or in flight): never proposed again
        self.visited: set[int] = set()
        self.best_index: int | None = None
        self.best_cost = float("inf")

    @abstractmethod
    def _propose(self, n: int) -> list[int]:
        """Up to ``n`` new indices not in ``self.visited``."""

    def ask(self, n: int) -> list[int]:
        """Propose up to ``n`` configs never proposed before (fewer when the space is spent)."""
        picks = [i for i in self._propose(n) if i not in self.visited][:n]
        self.visited.update(picks)
        return picks

    def tell(self, indices: Sequence[int], results: Sequence[MeasureResult]) -> None:
        """Record measurements (of this tuner's proposals or of earlier runs being replayed)."""
        for index, result in zip(indices, results, strict=True):
            self.visited.add(index)
            if result.ok and result.mean_cost < self.best_cost:
                self.best_cost, self.best_index = result.mean_cost, index
        self._update(indices, results)

    def _update(  # noqa: B027 - optional hook: strategies that learn override it
        self, indices: Sequence[int], results: Sequence[MeasureResult]
    ) -> None:
        """Strategy-specific learning; the default learns nothing."""

    def exhausted(self) -> bool:
        return len(self.visited) >= self.space.size
