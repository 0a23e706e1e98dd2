"""The models of the end-to-end benchmark as ONNX files: the samples (built in code, written once
under ``bench/.e2e-cache/models/``) and the zoo (exported by ``bench/zoo.py``'s cached exporter
in ``.venv-zoo``). Every engine then reads the same file, as a user's runtime would.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from zoo import MODELS as ZOO_MODELS
from zoo import export

from tuner_service.compiler.frontend.samples import SAMPLE_MODELS, build_sample_model

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".e2e-cache"
SAMPLES = tuple(SAMPLE_MODELS)
ALL_MODELS = SAMPLES + tuple(ZOO_MODELS)


class ModelUnavailable(Exception):
    """A model that cannot be had here (its export failed, or it is not known)."""


@dataclasses.dataclass(frozen=True)
class BenchModel:
    name: str
    #: "sample" (built in code, PyTorch eager through e2e_torch) or "zoo" (torchvision and
    #: transformers, PyTorch eager in .venv-zoo)
    kind: str
    path: Path


def kind_of(name: str) -> str:
    if name in SAMPLES:
        return "sample"
    if name in ZOO_MODELS:
        return "zoo"
    raise ModelUnavailable(f"unknown model {name!r}; choose from {', '.join(ALL_MODELS)}")


def model_file(name: str, zoo_python: Path, exporter: str = "torchscript") -> BenchModel:
    """The ONNX file of ``name`` (written or exported now when missing)."""
    kind = kind_of(name)
    if kind == "sample":
        path = CACHE / "models" / f"{name}.onnx"
        data = build_sample_model(name).SerializeToString()
        if not path.exists() or path.read_bytes() != data:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return BenchModel(name, kind, path)
    exported = export(name, exporter, zoo_python, refresh=False)
    if not exported.get("ok"):
        raise ModelUnavailable(f"{name}: export failed: {exported.get('error', 'unknown')}")
    return BenchModel(name, kind, Path(exported["path"]))
