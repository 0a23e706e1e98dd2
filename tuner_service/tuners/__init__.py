"""Tuners by name (the ``--tuner`` values), built from a ``TunerSpec``.

The learned tuners are compositions of ``ModelTuner`` (``model_based.py``): ``xgb`` is an
XGBoost cost model with annealing search; ``xgb-transfer`` the same with the cost model warmed
by other workloads' records (``cost_model.TransferCostModel``). They import xgboost lazily.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from schedule_templates.space import ConfigSpace
from schedule_templates.workloads import Workload
from tuner_service.tuners.base import Tuner
from tuner_service.tuners.simple import GridTuner, RandomTuner

if TYPE_CHECKING:
    from schedule_templates.features import FeatureExtractor
    from schedule_templates.templates.base import Template
    from tuner_service.cost_model import CostModel, PriorCache, TransferParams, XGBParams
    from tuner_service.tuners.transfer import TransferRecord


@dataclasses.dataclass(frozen=True)
class TunerSpec:
    """What a tuner is built from. ``template`` lets the learned tuners lower configs (they
    need it); ``transfer`` holds other workloads' records for ``xgb-transfer`` (the others
    ignore them); ``priors`` shares their featurised prior among the tuners built with it;
    ``options`` go to the tuner (``params=...``, ``model_params=...``, ...)."""

    workload: Workload
    space: ConfigSpace
    seed: int = 0
    template: Template | None = None
    transfer: tuple[TransferRecord, ...] = ()
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    priors: PriorCache | None = None


TunerFactory = Callable[[TunerSpec], Tuner]


def _random(spec: TunerSpec) -> Tuner:
    return RandomTuner(spec.workload, spec.space, spec.seed)


def _grid(spec: TunerSpec) -> Tuner:
    return GridTuner(spec.workload, spec.space, spec.seed)


def _ga(spec: TunerSpec) -> Tuner:
    from tuner_service.tuners.ga import GATuner

    return GATuner(spec.workload, spec.space, spec.seed, **spec.options)


def _xgb(spec: TunerSpec) -> Tuner:
    return _model_tuner(spec, transfer=False)


def _xgb_transfer(spec: TunerSpec) -> Tuner:
    return _model_tuner(spec, transfer=True)


def _model_tuner(spec: TunerSpec, transfer: bool) -> Tuner:
    """``ModelTuner`` with an XGBoost model (transfer-warmed when there are records of the
    template) and annealing search. Options: ``params`` (``ModelTunerParams``), ``search``
    (``AnnealParams``), ``cold_search`` (``AnnealParams`` of the first plan from a prior),
    ``model_params`` (``XGBParams``), ``transfer_params``."""
    # imported here: the learned tuners pull in the features and the cost model
    from schedule_templates.features import FeatureExtractor
    from tuner_service.cost_model import TransferParams, XGBCostModel, XGBParams
    from tuner_service.tuners.annealing import COLD_START, AnnealingSearch, AnnealParams
    from tuner_service.tuners.model_based import ModelTuner
    from tuner_service.tuners.strategy import ColdStart, SearchStrategy

    if spec.template is None:
        raise ValueError("the learned tuners need the template of the workload")
    options = dict(spec.options)
    model_params = options.pop("model_params", None) or XGBParams(seed=spec.seed)
    transfer_params = options.pop("transfer_params", None) or TransferParams()
    params = options.pop("params", None)
    search = options.pop("search", None) or AnnealParams()
    cold_search = options.pop("cold_search", None) or COLD_START
    if options:
        raise TypeError(f"unknown tuner options: {', '.join(sorted(options))}")
    extractor = FeatureExtractor(spec.template, spec.workload, spec.space)
    model: CostModel = XGBCostModel(model_params)
    strategy: SearchStrategy = AnnealingSearch(search)
    records = [r for r in spec.transfer if r.template == spec.template.name] if transfer else []
    if records:
        model = _warmed(spec, extractor, records, model_params, transfer_params)
        # the first plan (from the prior alone) is a short walk: each scored config costs a
        # lowering, and the full walk scored ~1900 (2-4 s per task) where this one scores
        # ~200. Its first batch is a little slower (synthetic dense: 6.0x random, 7.8x for the
        # full walk); the replayed searches reached 90%/95% of the best as fast
        strategy = ColdStart(AnnealingSearch(cold_search), strategy)
    return ModelTuner(spec.workload, spec.space, spec.seed, extractor=extractor, model=model,
                      strategy=strategy, params=params)


def _warmed(spec: TunerSpec, extractor: FeatureExtractor, records: list[TransferRecord],
            model_params: XGBParams, params: TransferParams) -> CostModel:
    from tuner_service.cost_model import Prior, TransferCostModel, XGBCostModel
    from tuner_service.tuners.transfer import prior_training_set

    # the prior's record sample and model are seeded alike for every task, so the tasks given
    # the same records can share one prior
    prior_params = dataclasses.replace(model_params, seed=0)

    def build() -> Prior:
        return Prior(lambda: prior_training_set(extractor, records, params.max_records,
                                                np.random.default_rng(0)),
                     lambda: XGBCostModel(prior_params))

    if spec.priors is None:
        prior = build()
    else:
        template = extractor.template
        key = (template.name, template.version, extractor.knobs, prior_params,
               params.max_records, tuple(records))
        prior = spec.priors.get(key, build)
    return TransferCostModel(lambda: XGBCostModel(model_params), prior, params)


_TUNERS: dict[str, TunerFactory] = {
    "random": _random,
    "grid": _grid,
    "ga": _ga,
    "xgb": _xgb,
    "xgb-transfer": _xgb_transfer,
}
#: tuners that use ``transfer`` records (the others ignore them)
TRANSFER_TUNERS = frozenset({"xgb-transfer"})


def tuner_names() -> list[str]:
    return sorted(_TUNERS)


def build_tuner(name: str, spec: TunerSpec) -> Tuner:
    """A tuner by ``--tuner`` name."""
    try:
        factory = _TUNERS[name]
    except KeyError:
        known = ", ".join(tuner_names())
        raise ValueError(f"unknown tuner {name!r}; choose from {known}") from None
    return factory(spec)


def make_tuner(name: str, workload: Workload, space: ConfigSpace, seed: int = 0, *,
               template: Template | None = None, transfer: Iterable[TransferRecord] = (),
               priors: PriorCache | None = None, **options: Any) -> Tuner:
    """``build_tuner`` with the spec's fields as arguments."""
    return build_tuner(name, TunerSpec(workload, space, seed, template, tuple(transfer),
                                       options, priors))


__all__ = ["TRANSFER_TUNERS", "GridTuner", "RandomTuner", "Tuner", "TunerSpec", "build_tuner",
           "make_tuner", "tuner_names"]
