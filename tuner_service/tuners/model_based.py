"""The model-based tuner (``xgb``): a cost model on loop-nest features steers the proposals.

``tell`` featurises the measured configs and refits the model (normalised throughput, failures
0). ``ask`` runs parallel simulated annealing with the model's score as the energy and hands out
the best configs it found that were never proposed, plus a share ``epsilon`` of random configs
so that a wrong model cannot trap the search. An optional diversity filter trades a little score
for configs that differ in more knobs. One annealing run serves several ``ask`` calls until the
model is refitted (the server asks a few configs at a time).

Until the model has something to learn from (two measurements that differ, at least one
success), proposals are random.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from schedule_templates.features import FeatureExtractor
from schedule_templates.records import MeasureResult
from schedule_templates.space import ConfigSpace
from schedule_templates.workloads import Workload
from tuner_service.cost_model import XGBCostModel, XGBParams, normalise, throughputs
from tuner_service.tuners.annealing import AnnealParams, anneal
from tuner_service.tuners.base import Tuner

logger = logging.getLogger(__name__)

#: (features, labels, groups, weights) for one fit
TrainingSet = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclasses.dataclass(frozen=True)
class ModelTunerParams:
    #: share of every batch drawn at random
    epsilon: float = 0.1
    #: weight of knob novelty against score rank in the diversity filter (0: off)
    diversity: float = 0.0
    #: one annealing run keeps at least this many candidates for the following asks
    plan_size: int = 64
    #: random valid configs scored before annealing: they compete for the plan and the best
    #: of them start chains (in a small or sparse space they find what local moves cannot)
    random_candidates: int = 256
    #: measured configs (best first) that seed the annealing chains
    elite_starts: int = 16
    anneal: AnnealParams = dataclasses.field(default_factory=AnnealParams)


def find_template(workload: Workload, space: ConfigSpace) -> Any:
    """The registered template whose space for ``workload`` is ``space``."""
    from schedule_templates.templates.base import all_templates

    for template in all_templates():
        if template.op == workload.op and template.space(workload).knobs == space.knobs:
            return template
    raise ValueError(f"no registered template of {workload.op} has this space; "
                     "pass the template to the learned tuners")


class ModelTuner(Tuner):
    def __init__(self, workload: Workload, space: ConfigSpace, seed: int = 0, *,
                 template: Any = None, extractor: FeatureExtractor | None = None,
                 params: ModelTunerParams | None = None,
                 model_params: XGBParams | None = None) -> None:
        super().__init__(workload, space, seed)
        if extractor is None:
            template = template if template is not None else find_template(workload, space)
            extractor = FeatureExtractor(template, workload, space)
        self.extractor = extractor
        self.params = params or ModelTunerParams()
        self.model = XGBCostModel(model_params or XGBParams(seed=seed))
        self._measured: list[int] = []  # featurisable measured configs, in tell order
        self._rows: list[np.ndarray] = []
        self._throughput: list[float] = []
        self._plan: list[int] = []  # candidates of the last annealing run, best first
        self._chains: list[int] = []
        #: configs scored by the last annealing run (how much work ``ask`` did)
        self.last_evaluated = 0

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

    def training_set(self) -> TrainingSet | None:
        """What the next fit learns from (``xgb-transfer`` adds other workloads)."""
        return self.own_training_set()

    def refit(self) -> None:
        """Fit the model again on ``training_set()``; the old plan is dropped."""
        data = self.training_set()
        if data is None:
            return
        self.model.fit(*data)
        self._plan = []

    # --- proposing --------------------------------------------------------------------------

    def _propose(self, n: int) -> list[int]:
        if n <= 0:
            return []
        n_random = 0 if not self.model.trained else round(self.params.epsilon * n)
        picks = self._model_picks(n - n_random) if self.model.trained else []
        return picks + self.space.sample(n - len(picks), self.rng,
                                         exclude=self.visited.union(picks))

    def _model_picks(self, n: int) -> list[int]:
        if n <= 0:
            return []
        self._plan = [i for i in self._plan if i not in self.visited]
        if len(self._plan) < n:
            self._plan = self._search(max(self.params.plan_size, 2 * n))
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

    def _search(self, size: int) -> list[int]:
        chains = self.params.anneal.chains
        fresh = self.space.sample(self.params.random_candidates, self.rng, exclude=self.visited)
        fresh_scores = self.score(fresh)
        best_fresh = [fresh[i] for i in np.argsort(-fresh_scores, kind="stable")]
        order = np.argsort(-np.asarray(self._throughput), kind="stable")
        elite = [self._measured[i] for i in order[: self.params.elite_starts]]
        # persistent chains continue where the last run stopped; then the best measured and
        # the best random configs
        starts = list(dict.fromkeys(self._chains[: chains // 4] + elite + best_fresh))
        result = anneal(self.space, self.score, starts, size, self.visited, self.rng,
                        self.space.is_valid, self.params.anneal,
                        scored=zip(fresh, fresh_scores.tolist(), strict=True))
        self._chains = result.ends
        self.last_evaluated = result.evaluated + len(fresh)
        logger.debug("annealing scored %d configs, kept %d", result.evaluated, len(result.pool))
        return result.pool

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
