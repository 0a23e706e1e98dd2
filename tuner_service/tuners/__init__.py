"""Tuners by name (the ``--tuner`` values). Learned tuners import xgboost lazily."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from schedule_templates.space import ConfigSpace
from schedule_templates.workloads import Workload
from tuner_service.tuners.base import Tuner
from tuner_service.tuners.simple import GridTuner, RandomTuner

#: (workload, space, seed, template, transfer records, options) -> tuner
TunerFactory = Callable[[Workload, ConfigSpace, int, Any, list[Any], dict[str, Any]], Tuner]


def _random(w: Workload, s: ConfigSpace, seed: int, template: Any, transfer: list[Any],
            options: dict[str, Any]) -> Tuner:
    return RandomTuner(w, s, seed)


def _grid(w: Workload, s: ConfigSpace, seed: int, template: Any, transfer: list[Any],
          options: dict[str, Any]) -> Tuner:
    return GridTuner(w, s, seed)


def _ga(w: Workload, s: ConfigSpace, seed: int, template: Any, transfer: list[Any],
        options: dict[str, Any]) -> Tuner:
    from tuner_service.tuners.ga import GATuner

    return GATuner(w, s, seed, **options)


def _xgb(w: Workload, s: ConfigSpace, seed: int, template: Any, transfer: list[Any],
         options: dict[str, Any]) -> Tuner:
    # imported here: the learned tuners pull in the cost model (xgboost on first fit)
    from tuner_service.tuners.model_based import ModelTuner

    return ModelTuner(w, s, seed, template=template, **options)


def _xgb_transfer(w: Workload, s: ConfigSpace, seed: int, template: Any, transfer: list[Any],
                  options: dict[str, Any]) -> Tuner:
    from tuner_service.tuners.transfer import TransferTuner

    return TransferTuner(w, s, seed, template=template, transfer=transfer, **options)


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


def make_tuner(name: str, workload: Workload, space: ConfigSpace, seed: int = 0, *,
               template: Any = None, transfer: Iterable[Any] = (), **options: Any) -> Tuner:
    """A tuner by ``--tuner`` name. ``template`` lets the learned tuners lower configs (found
    from the space when omitted); ``transfer`` holds ``TransferRecord``s of other workloads for
    ``xgb-transfer``; ``options`` go to the tuner's constructor (``params=...`` etc.)."""
    try:
        factory = _TUNERS[name]
    except KeyError:
        known = ", ".join(tuner_names())
        raise ValueError(f"unknown tuner {name!r}; choose from {known}") from None
    return factory(workload, space, seed, template, list(transfer), options)


__all__ = ["TRANSFER_TUNERS", "GridTuner", "RandomTuner", "Tuner", "make_tuner", "tuner_names"]
