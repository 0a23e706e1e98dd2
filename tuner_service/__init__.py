"""The tuning server: REST API, database, ONNX frontend, tuners, cost model, scheduler, CLI.

The Python API (``tune``, ``build``, ``load``, ``Client``, ``Job``...) lives in
``tuner_service.python_api`` and is re-exported here on first use, so importing the package
imports nothing heavy (a worker-only install imports ``tuner_service.cli`` through it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner_service.python_api import (
        Client,
        ClientError,
        Job,
        JobProgress,
        LoadedModel,
        TaskProgress,
        TuneError,
        TuneResult,
        build,
        load,
        tune,
    )

__all__ = ["Client", "ClientError", "Job", "JobProgress", "LoadedModel", "TaskProgress",
           "TuneError", "TuneResult", "build", "load", "tune"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("tuner_service.python_api"), name)
    raise AttributeError(f"module 'tuner_service' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
