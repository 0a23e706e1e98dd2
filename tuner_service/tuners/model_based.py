"""The model-based tuner: a cost model on loop-nest features steers a search strategy.

``tell`` featurises the measured configs and refits the model (normalised throughput, failures
0). ``ask`` lets the strategy (``annealing.AnnealingSearch``, ``strategy.TopKSample``) plan with
the model's score and hands out the best configs planned that were never proposed, plus a share
``epsilon`` of random configs so that a wrong model cannot trap the search. An optional
diversity filter trades a little score for configs that differ in more knobs. One plan serves
several ``ask`` calls until the model is refitted (the server asks a few configs at a time).

Until the model has something to learn from (two measurements that differ, at least one
success) it is trained on what it knew before (``CostModel.fit_prior``: a transfer-warmed
model) or, knowing nothing, proposals are random. ``xgb`` and ``xgb-transfer`` are compositions
of this tuner (``tuners/__init__.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from schedule_templates.features import FeatureExtractor
from schedule_templates.records import MeasureResult
from schedule_templates.space import ConfigSpace
from schedule_templates.workloads import Workload
from tuner_service.cost_model import CostModel, TrainingSet, normalise, throughputs
from tuner_service.tuners.base import Tuner
from tuner_service.tuners.strategy import SearchStrategy


@dataclasses.dataclass(frozen=True)
class ModelTunerParams:
    #: share of every batch drawn at random
    epsilon: float = 0.1
    #: weight of knob novelty against score rank in the diversity filter (0: off)
    diversity: float = 0.0
    #: one plan keeps at least this many candidates for the following asks
    plan_size: int = 64


class ModelTuner(Tuner):
    def __init__(self, workload: Workload, space: ConfigSpace, seed: int = 0, *,
                 extractor: FeatureExtractor, model: CostModel, strategy: SearchStrategy,
                 params: ModelTunerParams | None = None) -> None:
        super().__init__(workload, space, seed)
        self.extractor = extractor
        self.model = model
        self.strategy = strategy
        self.params = params or ModelTunerParams()
        self._measured: list[int] = []  # featurisable measured configs, in tell order
        self._rows: list[np.ndarray] = []
        self._throughput: list[float] = []
        self._plan: list[int] = []  # candidates of the last plan, best first

    # --- learning ---------------------------------------------------------------------------

    def _update(self, indices: Sequence[int], results: Sequence[MeasureResult]) -> None:
        values = throughputs(results)
        for index, value in zip(indices, values, strict=True):
            row = self.extractor.row(int(index))
            if row is None:  # the template cannot lower it any more: nothing to learn
                continue
            self._measured.append(int(index))
            self._rows.append(row)
            self._throughput.append(float(value))
        self.refit()

    def own_training_set(self) -> TrainingSet | None:
        """This task's measurements as one group, or None while they teach nothing."""
        y = np.asarray(self._throughput)
        if len(y) < 2 or y.max(initial=0.0) <= 0 or len(np.unique(y)) < 2:
            return None
        return (np.stack(self._rows), normalise(y), np.zeros(len(y), dtype=np.int64),
                np.ones(len(y)))

    def refit(self) -> None:
        """Fit the model again on ``own_training_set()``; the old plan is dropped."""
        data = self.own_training_set()
        if data is None:
            return
        self.model.fit(*data)
        self._plan = []

    # --- proposing --------------------------------------------------------------------------

    def _propose(self, n: int) -> list[int]:
        if n <= 0:
            return []
        if not self.model.trained:
            self.model.fit_prior()  # nothing learnt yet: what the model knew before, if any
        n_random = 0 if not self.model.trained else round(self.params.epsilon * n)
        picks = self._model_picks(n - n_random) if self.model.trained else []
        return picks + self.space.sample(n - len(picks), self.rng,
                                         exclude=self._visited.union(picks))

    def _model_picks(self, n: int) -> list[int]:
        if n <= 0:
            return []
        self._plan = [i for i in self._plan if i not in self._visited]
        if len(self._plan) < n:
            order = np.argsort(-np.asarray(self._throughput), kind="stable")
            elite = [self._measured[i] for i in order]
            self._plan = self.strategy.plan(self.space, self.score,
                                            max(self.params.plan_size, 2 * n), self._visited,
                                            self.rng, elite)
        if self.params.diversity > 0:
            picks = self._diverse(self._plan[: 3 * n], n)
        else:
            picks = self._plan[:n]
        chosen = set(picks)
        self._plan = [i for i in self._plan if i not in chosen]
        return picks

    def score(self, indices: Sequence[int]) -> np.ndarray:
        """Model scores; -inf for configs that cannot run."""
        x = self.extractor.features(indices)
        out = np.full(len(indices), -np.inf)
        ok = ~np.isnan(x).any(axis=1)
        if ok.any():
            out[ok] = self.model.predict(x[ok])
        return out

    def _diverse(self, candidates: list[int], n: int) -> list[int]:
        """Greedy: each pick maximises (rank score) + diversity x (share of knobs whose value no
        earlier pick has), so a batch does not spend itself on one corner of the space."""
        if len(candidates) <= n:
            return candidates
        digits = [self.space.digits(i) for i in candidates]
        rank_score = 1.0 - np.arange(len(candidates)) / len(candidates)
        seen: list[set[int]] = [set() for _ in self.space.dims]
        left = list(range(len(candidates)))
        picks: list[int] = []
        while len(picks) < n:
            def gain(c: int) -> float:
                new = sum(d not in seen[k] for k, d in enumerate(digits[c]))
                return float(rank_score[c]) + self.params.diversity * new / len(seen)
            best = max(left, key=gain)
            left.remove(best)
            picks.append(candidates[best])
            for k, d in enumerate(digits[best]):
                seen[k].add(d)
        return picks
