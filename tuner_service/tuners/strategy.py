"""Search strategies of the model-based tuner: where to look for the configs a score likes.

A strategy gets a score (the cost model on feature rows) and returns a plan: up to ``size``
configs never proposed, best first. ``AnnealingSearch`` (``annealing.py``) walks the space from
good starts; ``ColdStart`` plans differently before anything of the workload is measured (the
model then knows only a prior, and a short walk does).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet

import numpy as np

from schedule_templates.space import ConfigSpace

#: scores of many configs at once; -inf (or nan) marks a config that cannot run
Score = Callable[[Sequence[int]], np.ndarray]


class SearchStrategy(ABC):
    #: configs scored by the last plan (what it cost)
    evaluated: int = 0

    @abstractmethod
    def plan(self, space: ConfigSpace, score: Score, size: int, exclude: AbstractSet[int],
             rng: np.random.Generator, elite: Sequence[int] = ()) -> list[int]:
        """Up to ``size`` configs of ``space`` not in ``exclude``, best-scored first; ``elite``
        are measured configs, fastest first (good places to search around)."""


class ColdStart(SearchStrategy):
    """``cold`` plans until a config of this workload is measured (the model then knows only a
    prior: a cheap plan does), ``warm`` afterwards."""

    def __init__(self, cold: SearchStrategy, warm: SearchStrategy) -> None:
        self.cold, self.warm = cold, warm

    def plan(self, space: ConfigSpace, score: Score, size: int, exclude: AbstractSet[int],
             rng: np.random.Generator, elite: Sequence[int] = ()) -> list[int]:
        strategy = self.warm if elite else self.cold
        out = strategy.plan(space, score, size, exclude, rng, elite)
        self.evaluated = strategy.evaluated
        return out
