"""The tuner contract: ``ask(n)`` proposes config indices, ``tell(indices, results)`` learns.

Tuners are strategies only: they never time, log-configure, write files or touch the database.
The loop that measures and records (local loop, server job driver) owns all of that.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet

import numpy as np

from schedule_templates.records import MeasureResult
from schedule_templates.space import ConfigSpace
from schedule_templates.workloads import Workload


class Tuner(ABC):
    def __init__(self, workload: Workload, space: ConfigSpace, seed: int = 0) -> None:
        self.workload = workload
        self.space = space
        self.rng = np.random.default_rng(seed)
        self._visited: set[int] = set()
        self.best_index: int | None = None
        self.best_cost = float("inf")

    @property
    def visited(self) -> AbstractSet[int]:
        """Every index proposed, told or excluded so far: never proposed again."""
        return self._visited

    def exclude(self, indices: Iterable[int]) -> list[int]:
        """Never propose ``indices`` (configs in flight elsewhere, seeds handed out by the
        caller); returns those that were not excluded already, in order."""
        fresh = [i for i in dict.fromkeys(int(i) for i in indices) if i not in self._visited]
        self._visited.update(fresh)
        return fresh

    @abstractmethod
    def _propose(self, n: int) -> list[int]:
        """Up to ``n`` new indices not in ``self.visited``."""

    def ask(self, n: int) -> list[int]:
        """Propose up to ``n`` configs never proposed before (fewer when the space is spent)."""
        fresh = [i for i in dict.fromkeys(self._propose(n)) if i not in self._visited][:n]
        self._visited.update(fresh)
        return fresh

    def tell(self, indices: Sequence[int], results: Sequence[MeasureResult]) -> None:
        """Record measurements (of this tuner's proposals or of earlier runs being replayed)."""
        for index, result in zip(indices, results, strict=True):
            self._visited.add(index)
            if result.ok and result.mean_cost < self.best_cost:
                self.best_cost, self.best_index = result.mean_cost, index
        self._update(indices, results)

    def _update(  # noqa: B027 - optional hook: strategies that learn override it
        self, indices: Sequence[int], results: Sequence[MeasureResult]
    ) -> None:
        """Strategy-specific learning; the default learns nothing."""

    def exhausted(self) -> bool:
        return len(self._visited) >= self.space.size
