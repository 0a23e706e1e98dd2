"""Backends from a registry: a table from name to the class's import path.

Classes are imported on first use, so the fake backend never needs llvmlite and a CPU worker
never needs pycuda. A new backend (``cuda``) is one more row here.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import types
from collections.abc import Mapping
from typing import Any

from workers.backends.base import Backend, BoundKernel, Decoded, resolve
from workers.errors import BackendError, WorkerError

logger = logging.getLogger(__name__)

#: name -> (module, class, what to install when the import fails)
BACKENDS: Mapping[str, tuple[str, str, str]] = types.MappingProxyType({
    "llvm": ("workers.backends.llvm", "LlvmBackend", "pip install 'tuner[worker]' (llvmlite)"),
    "fake": ("workers.backends.fake", "FakeBackend", ""),
    "cuda": ("workers.backends.cuda", "CudaBackend", "pip install 'tuner[cuda]' (pycuda)"),
})


@dataclasses.dataclass(frozen=True)
class BackendSpec:
    """How to create a backend in another process: its name and constructor options."""

    name: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def backend_names() -> list[str]:
    return sorted(BACKENDS)


def backend_class(name: str) -> type[Backend]:
    try:
        module_name, class_name, hint = BACKENDS[name]
    except KeyError:
        raise BackendError(
            f"unknown backend {name!r}; known: {', '.join(backend_names())}"
        ) from None
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise BackendError(f"backend {name!r} needs {e.name}: {hint or 'install it'}") from e
    cls: type[Backend] = getattr(module, class_name)
    return cls


def create_backend(spec: BackendSpec) -> Backend:
    cls = backend_class(spec.name)
    try:
        return cls(**dict(spec.options))
    except (TypeError, ValueError) as e:
        raise BackendError(f"backend {spec.name!r}: bad options {dict(spec.options)}: {e}") from e


def accelerator_facts(name: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{"gpu": {...}}`` (name, ``compute_capability`` and launch limits, the keys GPU
    templates read as ``device``) for a GPU backend; {} for others or an unreadable GPU."""
    if name != "cuda":
        return {}
    from workers.backends.cuda import gpu_facts  # imports pycuda: only for a GPU worker

    try:
        return {"gpu": gpu_facts(int((options or {}).get("device", 0)))}
    except WorkerError as e:
        logger.warning("cannot read the GPU's facts: %s", e)
        return {}


__all__ = [
    "BACKENDS",
    "Backend",
    "BackendSpec",
    "BoundKernel",
    "Decoded",
    "accelerator_facts",
    "backend_class",
    "backend_names",
    "create_backend",
    "resolve",
]
