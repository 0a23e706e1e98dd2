"""A cost model warmed by other workloads' measurements (the model of ``xgb-transfer``).

The loop-nest features mean the same thing across shapes, so a model trained on other
workloads' measurements (the prior) ranks this workload's configs before any of them is
measured: ``fit_prior`` trains on the prior alone. Every later ``fit`` adds the prior as extra
groups (one per workload) whose weight

    prior_weight x relevance x half_life / (half_life + own rows)

decays as the workload's own measurements arrive (and leaves the fits once under
``min_share``, so late fits cost what the base model's do). ``relevance`` guards against an
unlike workload: once ``min_own`` own rows arrive, the model trained on the prior alone must
rank them better than chance, else the prior is switched off and only own data is learnt.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Hashable
from pathlib import Path

import numpy as np

from tuner_service.cost_model.base import CostModel, CostModelError, TrainingSet, stack
from tuner_service.cost_model.metrics import pairwise_accuracy

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TransferParams:
    prior_weight: float = 1.0
    #: own rows at which the prior's weight has halved
    half_life: int = 64
    #: own rows needed before the prior's relevance is judged
    min_own: int = 16
    #: prior pairwise accuracy on own data at or below which the prior is dropped, and above
    #: which it counts fully (linear in between)
    chance: float = 0.55
    trusted: float = 0.7
    #: records kept (a seeded sample spread evenly over workloads) to bound fitting time
    max_records: int = 2000
    #: below this share the prior leaves the fits (it no longer changes them, but costs time)
    min_share: float = 0.1


class Prior:
    """Other workloads' measurements as a training set (``load``), and a base model fitted on
    them alone; both built on first need (a server builds tuners inside a transaction, and
    featurising records is slow) and then shared by every model warmed by this prior."""

    def __init__(self, load: Callable[[], TrainingSet | None],
                 make_model: Callable[[], CostModel]) -> None:
        self._load: Callable[[], TrainingSet | None] | None = load
        self._make_model = make_model
        self._data: TrainingSet | None = None
        self._model: CostModel | None = None

    def data(self) -> TrainingSet | None:
        if self._load is not None:
            self._data, self._load = self._load(), None
        return self._data

    def model(self) -> CostModel | None:
        """The base model fitted on the prior alone (never refitted: callers only predict)."""
        data = self.data()
        if data is not None and self._model is None:
            self._model = self._make_model()
            self._model.fit(*data)
        return self._model


class PriorCache:
    """Priors shared by the tuners built together (the tasks of one job): tasks of one template
    receive the same records, so their prior is featurised and fitted once, not per task. Keeps
    the ``size`` most recently used."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._priors: dict[Hashable, Prior] = {}

    def get(self, key: Hashable, build: Callable[[], Prior]) -> Prior:
        prior = self._priors.pop(key, None) or build()
        self._priors[key] = prior  # most recent last
        while len(self._priors) > self.size:
            del self._priors[next(iter(self._priors))]
        return prior


class TransferCostModel(CostModel):
    """``make_model`` builds the base model (each fit trains a fresh one)."""

    def __init__(self, make_model: Callable[[], CostModel], prior: Prior,
                 params: TransferParams | None = None) -> None:
        self.params = params or TransferParams()
        self._make_model = make_model
        self._prior = prior
        self._model = make_model()
        #: the prior's weight multiplier (1 before judging, 0 once found unlike)
        self.relevance = 1.0
        self.own_rows = 0

    @property
    def trained(self) -> bool:
        return self._model.trained

    def prior(self) -> TrainingSet | None:
        return self._prior.data()

    def prior_share(self) -> float:
        p = self.params
        return p.prior_weight * self.relevance * p.half_life / (p.half_life + self.own_rows)

    def fit_prior(self) -> None:
        """Train on the prior alone (no own data yet); the same fit later judges the prior."""
        prior_model = self._prior.model()
        if prior_model is not None and not self._model.trained:
            self._model = prior_model

    def fit(self, features: np.ndarray, labels: np.ndarray, groups: np.ndarray | None = None,
            weights: np.ndarray | None = None) -> None:
        g = np.zeros(len(labels), dtype=np.int64) if groups is None else np.asarray(groups)
        w = np.ones(len(labels)) if weights is None else np.asarray(weights, dtype=np.float64)
        own: TrainingSet = (np.asarray(features), np.asarray(labels), g, w)
        self.own_rows = len(labels)
        prior = self.prior()
        if prior is not None:
            self._judge(own)
        share = self.prior_share()
        data = own
        if prior is not None and share >= self.params.min_share:
            x, y, prior_groups, prior_weights = prior
            first = int(g.max(initial=-1)) + 1  # prior groups follow the own ones
            data = stack([own, (x, y, prior_groups + first, prior_weights * share)])
        model = self._make_model()
        model.fit(*data)
        self._model = model

    def _judge(self, own: TrainingSet) -> None:
        p = self.params
        if len(own[1]) < p.min_own:
            return
        prior_model = self._prior.model()
        if prior_model is None:
            return
        accuracy = pairwise_accuracy(own[1], prior_model.predict(own[0]), own[2])
        self.relevance = float(np.clip((accuracy - p.chance) / (p.trusted - p.chance), 0, 1))
        logger.debug("prior ranks own data with accuracy %.3f: relevance %.2f",
                     accuracy, self.relevance)

    def predict(self, features: np.ndarray) -> np.ndarray:
        return self._model.predict(features)

    def save(self, path: str | Path) -> None:
        """Writes the current base model (it already holds what the prior taught)."""
        self._model.save(path)

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        raise CostModelError(f"{path}: a warmed model is saved as its base model; "
                             "load it with the base model's class")
