"""Fused epilogues: elementwise work applied to an operator's output before it is stored.

An epilogue is, in this fixed order, ``out = clip(acc * scale[k] + bias[k] + residual, lo, hi)``
where every part is optional: ``scale`` and ``bias`` are per output channel (axis 1 of the
output; a folded BatchNormalization is a scale plus a bias), ``residual`` is a tensor of the
output's shape (a skip connection) and the clip is ReLU, ReLU6 or any ``Clip(min, max)``.

In a workload key it is the last parameter, its parts joined by ``+`` in that order::

    conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1,epilogue=scale+bias+residual+relu

Parts: ``scale``, ``bias``, ``residual``, and at most one activation: ``relu`` (clip to
[0, inf)), ``relu6`` (clip to [0, 6]) or ``clip(LO:HI)`` with float32 bounds (``inf``/``-inf``
allowed), e.g. ``clip(-1:2.5)``; or one of the smooth activations that follow convolutions and
matmuls in real models: ``sigmoid``, ``silu`` (x * sigmoid(x)), ``hardswish``
(x * clip(x/6 + 1/2, 0, 1)), ``hardsigmoid(ALPHA:BETA)`` (clip(ALPHA * x + BETA, 0, 1); ONNX's
default is 0.2:0.5, PyTorch's 0.16666667:0.5, so the parameters are part of the key), ``tanh``
and ``gelu`` (the erf form, 0.5 x (1 + erf(x / sqrt 2))). A clip that equals ReLU or ReLU6 is
written as such; a bare ``hardsigmoid`` is ONNX's default. Parsing also accepts the parts in
any order and separated by spaces (a ``+`` in a URL query decodes to a space).
The epilogue changes only the output stage: a fused workload has its base workload's search
space, FLOPs and (by fallback) its tuning records.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping

import numpy as np

from schedule_templates.errors import InvalidWorkloadError

Shape = tuple[int, ...]

#: extra input names, in the order kernels take them (after the operator's own inputs)
EPILOGUE_INPUTS = ("scale", "bias", "residual")
#: smooth activations and their default parameters (hardsigmoid: ONNX's alpha and beta)
ACTIVATIONS: dict[str, tuple[float, ...]] = {
    "sigmoid": (), "silu": (), "hardswish": (), "hardsigmoid": (0.2, 0.5), "tanh": (),
    "gelu": (),
}
INF = math.inf


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """What happens to the accumulator before the store; the default does nothing."""

    scale: bool = False
    bias: bool = False
    residual: bool = False
    #: (low, high) float32 bounds; None for no clip
    clip: tuple[float, float] | None = None
    #: a smooth activation instead of a clip
    activation: Activation | None = None

    def __post_init__(self) -> None:
        if self.clip is not None and self.activation is not None:
            raise InvalidWorkloadError(
                f"epilogue: more than one activation ({_clip_text(self.clip)} and "
                f"{self.activation.text})")
        if self.clip is None:
            return
        low, high = (_f32(v) for v in self.clip)
        if math.isnan(low) or math.isnan(high) or low > high or low == INF or high == -INF:
            raise InvalidWorkloadError(f"epilogue: clip bounds {self.clip} are not low <= high")
        # clipping to everything is no activation at all
        bounds = None if low == -INF and high == INF else (low, high)
        object.__setattr__(self, "clip", bounds)

    def __bool__(self) -> bool:
        return (self.scale or self.bias or self.residual or self.clip is not None
                or self.activation is not None)

    @property
    def text(self) -> str:
        """The canonical text of the key parameter (empty for no epilogue)."""
        parts = [name for name in EPILOGUE_INPUTS if getattr(self, name)]
        if self.clip is not None:
            parts.append(_clip_text(self.clip))
        if self.activation is not None:
            parts.append(self.activation.text)
        return "+".join(parts)

    def __str__(self) -> str:
        return self.text or "none"

    def input_shapes(self, output_shape: Shape) -> dict[str, Shape]:
        """The extra inputs: per-channel vectors along axis 1, and the residual."""
        shapes: dict[str, Shape] = {}
        if self.scale:
            shapes["scale"] = (output_shape[1],)
        if self.bias:
            shapes["bias"] = (output_shape[1],)
        if self.residual:
            shapes["residual"] = tuple(output_shape)
        return shapes

    def apply(self, out: np.ndarray, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """The numpy semantics (the reference every fused kernel is checked against)."""
        if not self:
            return out
        channel = (1, -1) + (1,) * (out.ndim - 2)
        y = out.astype(np.float32, copy=True)
        if self.scale:
            y *= np.asarray(inputs["scale"], dtype=np.float32).reshape(channel)
        if self.bias:
            y += np.asarray(inputs["bias"], dtype=np.float32).reshape(channel)
        if self.residual:
            y += np.asarray(inputs["residual"], dtype=np.float32)
        if self.clip is not None:
            low, high = self.clip
            if low != -INF:
                y = np.maximum(y, np.float32(low))
            if high != INF:
                y = np.minimum(y, np.float32(high))
        if self.activation is not None:
            y = self.activation.apply(y)
        return y

    def describe(self) -> str:
        words = {"scale": "scale", "bias": "bias", "residual": "residual add"}
        parts = [words[name] for name in EPILOGUE_INPUTS if getattr(self, name)]
        if self.clip is not None:
            parts.append(_clip_text(self.clip))
        if self.activation is not None:
            parts.append(self.activation.text)
        return " + ".join(parts)


@dataclasses.dataclass(frozen=True)
class Activation:
    """A smooth activation named in ``ACTIVATIONS``; ``params`` default to the table's."""

    name: str
    params: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.name not in ACTIVATIONS:
            raise InvalidWorkloadError(f"epilogue: unknown activation {self.name!r}")
        defaults = ACTIVATIONS[self.name]
        params = tuple(self.params) or defaults
        if len(params) != len(defaults):
            raise InvalidWorkloadError(
                f"epilogue: {self.name} takes {len(defaults)} parameter(s), got {len(params)}")
        values = tuple(_f32(v) for v in params)
        if not all(math.isfinite(v) for v in values):
            raise InvalidWorkloadError(f"epilogue: {self.name} parameters must be finite")
        object.__setattr__(self, "params", values)

    @property
    def text(self) -> str:
        if not self.params:
            return self.name
        return f"{self.name}({':'.join(_number(v) for v in self.params)})"

    def apply(self, y: np.ndarray) -> np.ndarray:
        """The reference, computed in float64 and rounded once to float32."""
        x = y.astype(np.float64)
        with np.errstate(over="ignore"):
            out = _REFERENCE[self.name](x, self.params)
        return out.astype(np.float32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _erf(x: np.ndarray) -> np.ndarray:
    return np.frompyfunc(math.erf, 1, 1)(x).astype(np.float64)


_Reference = Callable[[np.ndarray, tuple[float, ...]], np.ndarray]
_REFERENCE: dict[str, _Reference] = {
    "sigmoid": lambda x, _: _sigmoid(x),
    "silu": lambda x, _: x * _sigmoid(x),
    "hardswish": lambda x, _: x * np.clip(x / 6.0 + 0.5, 0.0, 1.0),
    "hardsigmoid": lambda x, p: np.clip(p[0] * x + p[1], 0.0, 1.0),
    "tanh": lambda x, _: np.tanh(x),
    "gelu": lambda x, _: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
}


NO_EPILOGUE = Epilogue()
RELU = (0.0, INF)
RELU6 = (0.0, 6.0)


def parse_epilogue(text: str) -> Epilogue:
    """Parse the key form; ``""`` and ``none`` are no epilogue. Clear errors for anything else."""
    flags = dict.fromkeys(EPILOGUE_INPUTS, False)
    activation: tuple[float, float] | Activation | None = None
    tokens = [t for t in text.replace("+", " ").split() if t]
    if tokens == ["none"]:
        return NO_EPILOGUE
    for token in tokens:
        if token in flags:
            if flags[token]:
                raise InvalidWorkloadError(f"epilogue: {token!r} given twice")
            flags[token] = True
            continue
        parsed = _parse_activation(token)
        if activation is not None:
            raise InvalidWorkloadError(f"epilogue: more than one activation in {text!r}")
        activation = parsed
    if isinstance(activation, Activation):
        return Epilogue(flags["scale"], flags["bias"], flags["residual"], activation=activation)
    return Epilogue(flags["scale"], flags["bias"], flags["residual"], activation)


def _parse_activation(token: str) -> tuple[float, float] | Activation:
    name, _, rest = token.partition("(")
    if name in ACTIVATIONS:
        if not rest:
            return Activation(name)
        if not rest.endswith(")"):
            raise InvalidWorkloadError(f"epilogue: {token!r} has no closing bracket")
        try:
            params = tuple(float(v) for v in rest[:-1].split(":"))
        except ValueError:
            raise InvalidWorkloadError(
                f"epilogue: {token!r} parameters are not numbers separated by ':'") from None
        return Activation(name, params)
    if token == "relu":
        return RELU
    if token == "relu6":
        return RELU6
    if token.startswith("clip(") and token.endswith(")"):
        low, sep, high = token[5:-1].partition(":")
        try:
            if sep:
                return float(low), float(high)
        except ValueError:
            pass
        raise InvalidWorkloadError(f"epilogue: {token!r} is not clip(LOW:HIGH) with two numbers")
    raise InvalidWorkloadError(
        f"epilogue: unknown part {token!r}; expected scale, bias, residual, relu, relu6, "
        f"clip(LOW:HIGH) or one of {', '.join(ACTIVATIONS)}"
    )


def _clip_text(clip: tuple[float, float]) -> str:
    if clip == RELU:
        return "relu"
    if clip == RELU6:
        return "relu6"
    return f"clip({_number(clip[0])}:{_number(clip[1])})"


def _number(value: float) -> str:
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    magnitude = abs(value)
    if magnitude == 0 or 1e-4 <= magnitude < 1e6:
        return np.format_float_positional(np.float32(value), trim="-")
    # "1e+38" would read as two parts ("+" separates them): write 1e38, 1e-7
    text = np.format_float_scientific(np.float32(value), trim="-")
    return re.sub(r"e\+?(-?)0*(\d)", r"e\1\2", text)


def _f32(value: float) -> float:
    try:
        return float(np.float32(value)) + 0.0  # + 0.0 turns -0.0 into 0.0
    except (TypeError, ValueError):
        raise InvalidWorkloadError(f"epilogue: {value!r} is not a number") from None
