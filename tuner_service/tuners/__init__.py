"""Tuners by name (the ``--tuner`` values). Learned tuners import xgboost lazily."""

from __future__ import annotations

from collections.abc import Callable

from schedule_templates.space import ConfigSpace
from schedule_templates.workloads import Workload
from tuner_service.tuners.base import Tuner
from tuner_service.tuners.simple import GridTuner, RandomTuner

TunerFactory = Callable[[Workload, ConfigSpace, int], Tuner]

_TUNERS: dict[str, TunerFactory] = {
    "random": RandomTuner,
    "grid": GridTuner,
}


def tuner_names() -> list[str]:
    return sorted(_TUNERS)


def make_tuner(name: str, workload: Workload, space: ConfigSpace, seed: int = 0) -> Tuner:
    try:
        factory = _TUNERS[name]
    except KeyError:
        known = ", ".join(tuner_names())
        raise ValueError(f"unknown tuner {name!r}; choose from {known}") from None
    return factory(workload, space, seed)


__all__ = ["GridTuner", "RandomTuner", "Tuner", "make_tuner", "tuner_names"]
