"""The cost model contract: ``fit`` / ``predict`` / ``save`` / ``load``.

A cost model scores feature rows (``schedule_templates.features``): higher means faster. It is
trained on normalised throughput (each group's best config is 1, failed configs 0), so only the
order of scores within a workload carries meaning, never their scale.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tuner_service.errors import TunerServiceError

#: (features, labels, groups, weights) for one fit
TrainingSet = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class CostModelError(TunerServiceError):
    """Root of the errors the cost model package raises on purpose."""


class CostModel(ABC):
    @abstractmethod
    def fit(self, features: np.ndarray, labels: np.ndarray, groups: np.ndarray | None = None,
            weights: np.ndarray | None = None) -> None:
        """Train from scratch on rows ``features`` with normalised throughputs ``labels``.

        ``groups`` (one integer per row) says which rows are comparable (one group per
        workload); ``weights`` (one per row, equal within a group) scales each row's say."""

    def fit_prior(self) -> None:  # noqa: B027 - optional hook: warmed models override it
        """Train on what the model knows before this workload's own data (a model warmed by
        other workloads' measurements); the default knows nothing and stays untrained."""

    @abstractmethod
    def predict(self, features: np.ndarray) -> np.ndarray:
        """One score per row; higher is faster. Only valid after ``fit`` or ``load``."""

    @property
    @abstractmethod
    def trained(self) -> bool:
        """Whether ``predict`` may be called."""

    @abstractmethod
    def save(self, path: str | Path) -> None:
        """Write the trained model (and what it was trained on) to one file."""

    @classmethod
    @abstractmethod
    def load(cls, path: str | Path) -> CostModel:
        """Read a model written by ``save``."""


def stack(parts: Sequence[TrainingSet]) -> TrainingSet:
    """One training set from several (their groups must already be distinct)."""
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]), np.concatenate([p[3] for p in parts]))
