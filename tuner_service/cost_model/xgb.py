"""Gradient-boosted trees (xgboost) as the cost model.

xgboost is imported when a model is first fitted or loaded, so importing this module stays
cheap and a server without learned tuners needs no xgboost. The objective is a choice; the
default is the one that searched best on the measured replay data (``bench/data/search``:
dense and conv2d measured on this machine): ``rank:pairwise`` with 32 sampled pairs per config.
Replaying ``xgb`` over 4 workloads x 6 seeds it needed 60 trials on average to reach 95% of
the best, against 68 for regression and 139 for random search; held-out pairwise accuracy was
about equal (0.806 ranking, 0.811 regression). Regression learns the square root of normalised
throughput (``label_power``): the root spreads out the many slow configs. Ranking objectives
see only the order within a group, so they need no transform.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from schedule_templates.features import FEATURE_VERSION
from tuner_service.cost_model.base import CostModel, CostModelError

logger = logging.getLogger(__name__)

FORMAT = "tuner-xgb-cost-model/1"

#: the objectives compared; ranking objectives see only the order of configs within a group
OBJECTIVES: dict[str, dict[str, Any]] = {
    "rank:pairwise": {"objective": "rank:pairwise", "lambdarank_pair_method": "mean",
                      "lambdarank_num_pair_per_sample": 32},
    "rank:ndcg": {"objective": "rank:ndcg", "ndcg_exp_gain": False,
                  "lambdarank_pair_method": "topk", "lambdarank_num_pair_per_sample": 32},
    "reg:squarederror": {"objective": "reg:squarederror"},
}
DEFAULT_OBJECTIVE = "rank:pairwise"


def _xgboost() -> Any:
    try:
        import xgboost
    except ImportError as e:
        raise CostModelError(
            "the learned tuners need xgboost: pip install 'xgboost>=3.2,<3.3'") from e
    return xgboost


@dataclasses.dataclass(frozen=True)
class XGBParams:
    objective: str = DEFAULT_OBJECTIVE
    #: boosting rounds at most; small training sets get fewer (``rounds_for``)
    rounds: int = 120
    max_depth: int = 6
    eta: float = 0.15
    min_child_weight: float = 1.0
    subsample: float = 0.9
    colsample_bytree: float = 0.8
    max_bin: int = 64
    #: regression learns normalised throughput to this power (1: as is)
    label_power: float = 0.5
    #: one thread: on a shared 2-core machine two OpenMP threads made fits 10-20x slower
    #: (their barriers spin while the other core is busy); raise it on a dedicated host
    nthread: int = 1
    seed: int = 0

    def rounds_for(self, rows: int) -> int:
        """Fewer trees while data is scarce: a fit per batch stays cheap early in a search,
        and a few dozen rows cannot support 120 trees anyway."""
        return max(1, min(self.rounds, 30 + rows // 8))

    def booster_params(self) -> dict[str, Any]:
        if self.objective not in OBJECTIVES:
            raise CostModelError(f"unknown objective {self.objective!r}; "
                                 f"choose from {', '.join(OBJECTIVES)}")
        return {
            **OBJECTIVES[self.objective], "tree_method": "hist", "max_depth": self.max_depth,
            "eta": self.eta, "min_child_weight": self.min_child_weight,
            "subsample": self.subsample, "colsample_bytree": self.colsample_bytree,
            "max_bin": self.max_bin, "nthread": self.nthread, "seed": self.seed,
            "verbosity": 0,
        }


class XGBCostModel(CostModel):
    def __init__(self, params: XGBParams | None = None) -> None:
        self.params = params or XGBParams()
        self._booster: Any = None
        self.width: int | None = None

    @property
    def trained(self) -> bool:
        return self._booster is not None

    @property
    def ranking(self) -> bool:
        return self.params.objective.startswith("rank:")

    def fit(self, features: np.ndarray, labels: np.ndarray, groups: np.ndarray | None = None,
            weights: np.ndarray | None = None) -> None:
        xgb = _xgboost()
        x = np.asarray(features, dtype=np.float32)
        y = np.asarray(labels, dtype=np.float32)
        if x.ndim != 2 or len(x) != len(y) or len(y) == 0:
            raise CostModelError(f"features {x.shape} and labels {y.shape} do not match")
        g = np.zeros(len(y), dtype=np.int64) if groups is None else np.asarray(groups)
        w = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=np.float64)
        order = np.argsort(g, kind="stable")  # ranking needs each group's rows together
        x, y, g, w = x[order], y[order], g[order], w[order]
        if not self.ranking:
            y = np.power(np.maximum(y, 0.0), self.params.label_power)
        if self.ranking:
            starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
            # xgboost weighs ranking data per group: one weight per query
            data = xgb.DMatrix(x, label=y, qid=np.unique(g, return_inverse=True)[1],
                               weight=w[starts], missing=np.nan, nthread=self.params.nthread)
        else:
            data = xgb.DMatrix(x, label=y, weight=w, missing=np.nan,
                               nthread=self.params.nthread)
        self._booster = xgb.train(self.params.booster_params(), data,
                                  num_boost_round=self.params.rounds_for(len(y)))
        self.width = x.shape[1]

    def predict(self, features: np.ndarray) -> np.ndarray:
        if self._booster is None:
            raise CostModelError("the cost model is not trained")
        x = np.asarray(features, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.width:
            raise CostModelError(f"expected rows of {self.width} features, got {x.shape}")
        if len(x) == 0:
            return np.zeros(0)
        # in-place prediction skips building a DMatrix: the search calls this once per step
        return np.asarray(self._booster.inplace_predict(x, missing=np.nan), dtype=np.float64)

    def save(self, path: str | Path) -> None:
        """One xgboost JSON file; the parameters, width and feature version ride along as a
        booster attribute so a model is never applied to vectors of another layout."""
        if self._booster is None:
            raise CostModelError("the cost model is not trained")
        meta = {"format": FORMAT, "feature_version": FEATURE_VERSION, "width": self.width,
                "params": dataclasses.asdict(self.params)}
        self._booster.set_attr(tuner_meta=json.dumps(meta))
        self._booster.save_model(str(path))

    @classmethod
    def load(cls, path: str | Path) -> XGBCostModel:
        xgb = _xgboost()
        booster = xgb.Booster()
        try:
            booster.load_model(str(path))
        except xgb.core.XGBoostError as e:
            raise CostModelError(f"cannot read a cost model from {path}: {e}") from e
        raw = booster.attr("tuner_meta")
        meta = json.loads(raw) if raw else {}
        if meta.get("format") != FORMAT:
            raise CostModelError(f"{path} is not a model saved by this tuner")
        if meta.get("feature_version") != FEATURE_VERSION:
            raise CostModelError(
                f"{path} was trained on feature version {meta.get('feature_version')}, "
                f"this build extracts version {FEATURE_VERSION}")
        model = cls(XGBParams(**meta["params"]))
        booster.set_param({"nthread": model.params.nthread})
        model._booster, model.width = booster, int(meta["width"])
        return model
