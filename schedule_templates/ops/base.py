"""The contract of a generated operator and its registry.

A generated operator is the work of a model that is not worth a search: elementwise chains,
pooling, softmax, layer norm, reductions and data movement (concat, slice, transpose). Each
one is a frozen dataclass of shapes and attributes with one fixed schedule: ``lower`` builds
the loop nest (parallel over an outer loop, vectorized along the contiguous one), and the same
code generators as the tuned templates compile it, so it runs inside the model's library with
the calling convention of every kernel there:

    void NAME(float *input..., float *output, float *workspace..., int64_t nthreads)

Inputs come in ``input_shapes()`` order, dense row-major fp32 (a broadcast input is passed at
its own shape; the kernel indexes it with stride 0 along broadcast axes). ``reference`` is the
numpy semantics every kernel is tested against. ``to_json``/``op_from_json`` carry an operator
through a library manifest; ``key`` identifies it (two layers with equal keys share a kernel).
"""

from __future__ import annotations

import dataclasses
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

import numpy as np

from schedule_templates.errors import ScheduleError
from schedule_templates.ir.nodes import Kernel

Shape = tuple[int, ...]


class GeneratedOpError(ScheduleError):
    """A generated operator that cannot exist (bad shapes or attributes, unknown kind)."""


class GeneratedOp(ABC):
    """One non-tunable operator instance. Subclasses are frozen dataclasses."""

    kind: ClassVar[str]

    @abstractmethod
    def input_shapes(self) -> dict[str, Shape]:
        """Kernel input names -> shapes, in call order."""

    @abstractmethod
    def output_shape(self) -> Shape:
        """The one output's shape."""

    @abstractmethod
    def lower(self) -> Kernel:
        """The kernel: params are the inputs in order, then the output (named ``out``)."""

    @abstractmethod
    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """The numpy semantics (float32 result of ``output_shape``)."""

    def to_json(self) -> dict[str, Any]:
        fields = {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        return {"kind": self.kind, **fields}

    @property
    def key(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


_OPS: dict[str, type[GeneratedOp]] = {}
G = TypeVar("G", bound=type[GeneratedOp])


def register_op(cls: G) -> G:
    _OPS[cls.kind] = cls
    return cls


def op_kinds() -> list[str]:
    _load_builtin()
    return sorted(_OPS)


def op_from_json(data: Mapping[str, Any]) -> GeneratedOp:
    """Rebuild an operator from ``to_json``; GeneratedOpError for anything malformed."""
    _load_builtin()
    if not isinstance(data, Mapping) or data.get("kind") not in _OPS:
        kind = data.get("kind") if isinstance(data, Mapping) else None
        raise GeneratedOpError(f"unknown generated operator {kind!r}; known: "
                               f"{', '.join(sorted(_OPS))}")
    cls = _OPS[str(data["kind"])]
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    names = {f.name for f in fields}
    # a field with a default may be absent: manifests written before it existed, and
    # operators that leave a default out of their JSON (an fp32 transpose's dtype)
    required = {f.name for f in fields if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING}
    params = {k: _tuples(v) for k, v in data.items() if k != "kind"}
    if not required <= set(params) <= names:
        raise GeneratedOpError(f"{cls.kind}: expected fields {sorted(names)}, got {sorted(params)}")
    try:
        return cls(**params)
    except (TypeError, ValueError) as e:
        raise GeneratedOpError(f"{cls.kind}: {e}") from e


def _tuples(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def _load_builtin() -> None:
    """Import every operator module of this package once (each registers its operators)."""
    global _DISCOVERED
    if _DISCOVERED:
        return
    import importlib
    import pkgutil

    import schedule_templates.ops as package

    for info in pkgutil.iter_modules(package.__path__):
        if info.name != "base":
            importlib.import_module(f"schedule_templates.ops.{info.name}")
    _DISCOVERED = True


_DISCOVERED = False
