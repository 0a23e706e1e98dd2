"""Workload base class, canonical text keys, and the operator registry.

A key looks like ``conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1``. Parameters at their
default value are omitted when formatting; parsing accepts any order. Tuple parameters (stride,
pad, dilation) are written as one number when all entries are equal, else joined with ``x``
(``stride=2x1``, ``pad=0x1x1x0`` meaning top, left, bottom, right). Operators that can fuse
an epilogue take it as the last parameter, ``epilogue=bias+relu`` (see ``epilogue.py``); a key
without it is the operator alone, and ``base_key`` strips it.
"""

from __future__ import annotations

import dataclasses
import functools
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.workloads.epilogue import NO_EPILOGUE, Epilogue, parse_epilogue

# A single tensor larger than this (in elements) is refused: 4 GiB of fp32 is beyond any layer
# we tune, and such keys are the usual shape of hostile or corrupted input.
MAX_TENSOR_ELEMENTS = 1 << 30
MAX_DIM = 1 << 24

Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Workload(ABC):
    """One operator instance: shapes and attributes, fp32 throughout."""

    op: ClassVar[str]
    #: parameter name -> (kind, default); kind is "int", "pair" (h, w), "quad" (t, l, b, r),
    #: "epilogue" (an Epilogue, for operators that fuse one) or "choice" (a word from
    #: ``choices``, e.g. an output data type).
    params: ClassVar[dict[str, tuple[str, Any]]]
    choices: ClassVar[dict[str, tuple[str, ...]]] = {}

    def __post_init__(self) -> None:
        for name, (kind, _default) in self.params.items():
            value = getattr(self, name)
            if kind == "epilogue":
                if not isinstance(value, Epilogue):
                    raise InvalidWorkloadError(f"{self.op}: {name} must be an Epilogue")
                continue
            if kind == "choice":
                allowed = self.choices[name]
                if value not in allowed:
                    raise InvalidWorkloadError(
                        f"{self.op}: {name}={value!r} is not one of {', '.join(allowed)}")
                continue
            values = (value,) if kind == "int" else value
            for v in values:
                if not isinstance(v, int) or isinstance(v, bool):
                    raise InvalidWorkloadError(f"{self.op}: {name} must be an integer, got {v!r}")
                lower = 0 if name == "pad" else 1
                if v < lower or v > MAX_DIM:
                    raise InvalidWorkloadError(
                        f"{self.op}: {name}={v} is out of range [{lower}, {MAX_DIM}]"
                    )
        self.validate()
        for name, shape in [*self.input_shapes().items(), ("output", self.output_shape())]:
            if any(d < 1 for d in shape):
                raise InvalidWorkloadError(f"{self.op}: {name} would have shape {shape}")
            if int(np.prod(shape, dtype=np.int64)) > MAX_TENSOR_ELEMENTS:
                raise InvalidWorkloadError(
                    f"{self.op}: {name} of shape {shape} exceeds {MAX_TENSOR_ELEMENTS} elements"
                )

    def validate(self) -> None:  # noqa: B027 - optional hook, most workloads need none
        """Raise InvalidWorkloadError for impossible combinations; the base checks ranges."""

    @property
    def key(self) -> str:
        parts = []
        for name, (kind, default) in self.params.items():
            value = getattr(self, name)
            if value == _expand(kind, default):
                continue
            parts.append(f"{name}={_format_value(value)}")
        return f"{self.op}:{','.join(parts)}"

    def __str__(self) -> str:
        return self.key

    @property
    def epilogue_spec(self) -> Epilogue:
        """The fused epilogue (NO_EPILOGUE for the operator alone or one that cannot fuse)."""
        value = getattr(self, "epilogue", NO_EPILOGUE)
        return value if isinstance(value, Epilogue) else NO_EPILOGUE

    def base_workload(self) -> Workload:
        """The same operator without its epilogue: same search space, FLOPs and records."""
        if not self.epilogue_spec:
            return self
        return dataclasses.replace(self, epilogue=NO_EPILOGUE)  # type: ignore[call-arg]

    @property
    def base_key(self) -> str:
        return self.base_workload().key

    def with_epilogue(self, epilogue: Epilogue) -> Workload:
        """This operator with ``epilogue`` fused; InvalidWorkloadError if it cannot fuse one."""
        if self.params.get("epilogue", ("", None))[0] != "epilogue":
            raise InvalidWorkloadError(f"{self.op} cannot fuse an epilogue")
        return dataclasses.replace(self, epilogue=epilogue)  # type: ignore[call-arg]

    @abstractmethod
    def input_shapes(self) -> dict[str, Shape]:
        """Input tensors in call order: activations first, then weights."""

    @abstractmethod
    def output_shape(self) -> Shape: ...

    @abstractmethod
    def flops(self) -> int:
        """Floating-point operations of one run (a multiply-add counts as two)."""

    @abstractmethod
    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """The numpy result every candidate is checked against."""

    @abstractmethod
    def describe(self) -> str:
        """The workload in words, for people (dashboards, logs)."""

    #: inputs that are constant at inference time (weights): templates may pre-pack them once.
    constant_inputs: ClassVar[tuple[str, ...]] = ()
    #: small keys, odd shapes included, that the template contract tests run every template of
    #: this operator on (tests list their own shapes for the older operators)
    examples: ClassVar[tuple[str, ...]] = ()

    def make_inputs(self, rng: np.random.Generator | int = 0) -> dict[str, np.ndarray]:
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        return {
            name: gen.uniform(-1.0, 1.0, size=shape).astype(np.float32)
            for name, shape in self.input_shapes().items()
        }

    def to_dict(self) -> dict[str, Any]:
        return {name: _json_value(getattr(self, name)) for name in self.params}


def _json_value(value: Any) -> Any:
    return value.text if isinstance(value, Epilogue) else value


def _expand(kind: str, value: Any) -> Any:
    if kind == "pair" and isinstance(value, int):
        return (value, value)
    if kind == "quad" and isinstance(value, int):
        return (value, value, value, value)
    if kind == "quad" and isinstance(value, tuple) and len(value) == 2:
        return (value[0], value[1], value[0], value[1])
    return value


def _format_value(value: Any) -> str:
    if isinstance(value, Epilogue):
        return value.text
    if isinstance(value, tuple):
        if len(set(value)) == 1:
            return str(value[0])
        return "x".join(str(v) for v in value)
    return str(value)


def _parse_value(op: str, name: str, kind: str, text: str) -> Any:
    if kind == "epilogue":
        return parse_epilogue(text)
    if kind == "choice":
        return text
    pieces = text.replace("(", "").replace(")", "").split("x")
    try:
        numbers = tuple(int(p) for p in pieces)
    except ValueError:
        raise InvalidWorkloadError(f"{op}: {name}={text!r} is not an integer") from None
    want = {"int": (1,), "pair": (1, 2), "quad": (1, 2, 4)}[kind]
    if len(numbers) not in want:
        counts = " or ".join(map(str, want))
        raise InvalidWorkloadError(f"{op}: {name}={text!r} needs {counts} values")
    if kind == "int":
        return numbers[0]
    return _expand(kind, numbers[0] if len(numbers) == 1 else numbers)


_REGISTRY: dict[str, type[Workload]] = {}


def register(cls: type[Workload]) -> type[Workload]:
    _REGISTRY[cls.op] = cls
    return cls


def workload_ops() -> list[str]:
    return sorted(_REGISTRY)


def workload_class(op: str) -> type[Workload]:
    try:
        return _REGISTRY[op]
    except KeyError:
        raise InvalidWorkloadError(
            f"unknown operator {op!r}; known: {', '.join(workload_ops())}"
        ) from None


def make_workload(op: str, **values: Any) -> Workload:
    """Build a workload from keyword parameters; tuple shorthands are expanded."""
    cls = workload_class(op)
    unknown = set(values) - set(cls.params)
    if unknown:
        raise InvalidWorkloadError(
            f"{op}: unknown parameter(s) {', '.join(sorted(unknown))}; "
            f"expected {', '.join(cls.params)}"
        )
    missing = [n for n, (_k, d) in cls.params.items() if d is None and n not in values]
    if missing:
        raise InvalidWorkloadError(f"{op}: missing parameter(s) {', '.join(missing)}")
    kwargs = {}
    for name, (kind, default) in cls.params.items():
        raw = values.get(name, default)
        if kind == "epilogue":
            kwargs[name] = parse_epilogue(raw) if isinstance(raw, str) else raw
            continue
        if kind == "choice":
            kwargs[name] = raw
            continue
        if isinstance(raw, list):
            raw = tuple(raw)
        if kind != "int" and isinstance(raw, tuple) and not 0 < len(raw) <= 4:
            raise InvalidWorkloadError(f"{op}: {name}={raw!r} has the wrong length")
        if kind == "pair" and isinstance(raw, tuple) and len(raw) not in (1, 2):
            raise InvalidWorkloadError(f"{op}: {name}={raw!r} needs 1 or 2 values")
        if kind == "quad" and isinstance(raw, tuple) and len(raw) not in (1, 2, 4):
            raise InvalidWorkloadError(f"{op}: {name}={raw!r} needs 1, 2 or 4 values")
        if isinstance(raw, tuple) and len(raw) == 1:
            raw = raw[0]
        kwargs[name] = _expand(kind, raw)
    try:
        return cls(**kwargs)
    except TypeError as e:  # wrong value types reach the dataclass constructor
        raise InvalidWorkloadError(f"{op}: {e}") from e


def parse_workload(key: str) -> Workload:
    """Parse a canonical (or reordered) workload key; unknown names give a clear error.
    Workloads are immutable, so a key is parsed once and its workload shared."""
    if not isinstance(key, str) or ":" not in key:
        raise InvalidWorkloadError(f"workload key {key!r} must look like 'op:NAME=VALUE,...'")
    return _parse_key(key)


@functools.lru_cache(maxsize=4096)
def _parse_key(key: str) -> Workload:
    op, _, body = key.strip().partition(":")
    cls = workload_class(op.strip())
    values: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in body.split(","))):
        name, eq, text = item.partition("=")
        name = name.strip()
        if not eq:
            raise InvalidWorkloadError(f"{op}: {item!r} is not NAME=VALUE")
        if name not in cls.params:
            raise InvalidWorkloadError(
                f"{op}: unknown parameter {name!r}; expected {', '.join(cls.params)}"
            )
        if name in values:
            raise InvalidWorkloadError(f"{op}: parameter {name!r} given twice")
        values[name] = _parse_value(op, name, cls.params[name][0], text.strip())
    return make_workload(cls.op, **values)
