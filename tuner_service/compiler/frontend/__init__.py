"""ONNX frontend: turn an uploaded model into tuning tasks, and build sample models.

Public names are loaded on first use (PEP 562) so that importing this package does not import
onnx: the CLI and worker-only installs can import ``tuner_service.compiler.frontend.samples`` names
without the server extras.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner_service.compiler.frontend.errors import FrontendError, ModelError
    from tuner_service.compiler.frontend.extract import (
        ExtractedTask,
        ExtractionResult,
        Unsupported,
        extract_tasks,
    )
    from tuner_service.compiler.frontend.fusion import Layer, plan_layers
    from tuner_service.compiler.frontend.samples import (
        SAMPLE_MODELS,
        build_sample_model,
        sample_model_bytes,
    )

# public name -> submodule defining it
_EXPORTS = {
    "FrontendError": "errors",
    "ModelError": "errors",
    "ExtractedTask": "extract",
    "ExtractionResult": "extract",
    "Unsupported": "extract",
    "extract_tasks": "extract",
    "Layer": "fusion",
    "plan_layers": "fusion",
    "SAMPLE_MODELS": "samples",
    "build_sample_model": "samples",
    "sample_model_bytes": "samples",
}

__all__ = [
    "SAMPLE_MODELS",
    "ExtractedTask",
    "ExtractionResult",
    "FrontendError",
    "Layer",
    "ModelError",
    "Unsupported",
    "build_sample_model",
    "extract_tasks",
    "plan_layers",
    "sample_model_bytes",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
