"""Low-precision matrix multiplies: ``dense_int8`` (quantized), ``dense_bf16`` and
``batch_matmul_bf16``.

They are operators of their own, not a dtype flag on ``dense``: their inputs, outputs and
references differ, and records of different precisions must never mix (the operator name is
part of every workload key).

``dense_int8`` is the computation of onnxruntime's QLinearMatMul with uint8 activations and
symmetric int8 weights (the form ``quantize_static`` produces for VNNI CPUs): an exact int32
accumulation of ``(data - data_zero_point) * weight``, then the requantization fused as the
output stage: ``acc * scale`` in fp32 (``scale`` = data_scale * weight_scale / out_scale, per
tensor or per output channel), rounded half to even, plus the output zero point, saturated to
uint8 or int8; ``out=f32`` keeps the dequantized ``acc * scale`` instead. ``bias=s32`` adds an
int32 bias per output channel to the accumulator before scaling (QGemm's, quantized with scale
data_scale * weight_scale). Weight zero points
other than zero are not supported (they would need row sums of the activations in the kernel).
``weights=narrow`` promises every weight within [-64, 64] (``NARROW_WEIGHT``: what
``quantize_static`` gives with ``reduce_range=True``, onnxruntime's advice for CPUs without
VNNI): there a host without VNNI multiplies the bytes with ``vpmaddubsw``, whose 16-bit pair
sums cannot saturate with such weights, instead of widening them to 16 bits; a template refuses
wider weights for such a key at pack time (``check_weights``). The arithmetic and the
reference are the same either way.
``weights=sat16`` takes any int8 weights and sums each pair of byte products (reduction
indices 2j and 2j+1, as the packed layouts hold them) on 16 bits that saturate, as
``vpmaddubsw`` does: the arithmetic of onnxruntime's u8 x s8 kernels (and oneDNN's) on CPUs
without VNNI, whose outputs it reproduces there. Every x86 host runs it on ``vpmaddubsw``; the
reference applies the same saturation (``sat16_correction``).
``add=u8|s8`` fuses the quantized addition of a per-column constant that follows the product in
a QDQ model (BERT's bias: ``Int8Add`` of the 8-bit output and an 8-bit vector) into the output
stage, exactly as the two steps compute it (``add_requantized``): the u8/s8 output above is
dequantized with its own scale and zero point (``add_scale[0]``, ``add_zero_point[0]``),
``add_value`` (the constant, already dequantized to fp32) is added, and the sum is quantized
with ``add_scale[1]`` and ``add_zero_point[1]`` to the type ``add`` names.

``dense_bf16`` takes bfloat16 activations (numpy uint16 holding the bits) and fp32 weights,
which a template rounds to bfloat16 once at pack time; products accumulate in fp32. The
reference rounds the weights the same way, so only the summation order differs. With
``data=f32`` the activations arrive as fp32 and the kernel rounds them itself (what a model
built with ``--precision bf16`` runs: fp32 tensors between layers, bf16 products inside); such a
layer may fuse ``dense``'s epilogue, computed in fp32 on the fp32 sums.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.workloads.base import Shape, Workload, register
from schedule_templates.workloads.epilogue import NO_EPILOGUE, Epilogue

#: saturation range of each quantized output type
QUANT_RANGES: dict[str, tuple[int, int]] = {"u8": (0, 255), "s8": (-128, 127)}
QUANT_NUMPY: dict[str, type[np.generic]] = {"u8": np.uint8, "s8": np.int8}
#: the int8 operators' requantization parameters: output type, scale granularity, int32 bias
QUANT_PARAMS: dict[str, tuple[str, Any]] = {
    "out": ("choice", "u8"),
    "scale": ("choice", "channel"),
    "bias": ("choice", "none"),
    "weights": ("choice", "full"),
}
QUANT_CHOICES: dict[str, tuple[str, ...]] = {
    "out": ("u8", "s8", "f32"),
    "scale": ("channel", "tensor"),
    "bias": ("none", "s32"),
    "weights": ("full", "narrow", "sat16"),
}
#: the largest weight magnitude of ``weights=narrow`` (255 * 2 * 64 fits a saturating int16)
NARROW_WEIGHT = 64
#: how ``describe`` names each ``weights`` choice's sums
SUMS = {"full": "s32", "narrow": "s32", "sat16": "s16 pairs -> s32"}
#: the range ``weights=sat16`` saturates each pair of byte products to (``vpmaddubsw``'s)
INT16_MIN, INT16_MAX = -32768, 32767
#: a pair of weights whose positive (or negative) parts sum past this can saturate with u8 data
_SAFE_PAIR = INT16_MAX // 255
QUANT_CONSTANTS = ("weight", "data_zero_point", "scale", "bias", "out_zero_point")
#: the fused quantized addition's inputs (``dense_int8``'s ``add``)
ADD_INPUTS = ("add_value", "add_scale", "add_zero_point")


def to_bfloat16(x: np.ndarray) -> np.ndarray:
    """fp32 -> bfloat16 bits (uint16), rounded to nearest even (finite inputs)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def from_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> the fp32 values they stand for (exact)."""
    wide = np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16
    return wide.view(np.float32)


def narrow_weights(weight: np.ndarray) -> bool:
    """Whether every weight is within [-NARROW_WEIGHT, NARROW_WEIGHT] (``weights=narrow``)."""
    w = np.asarray(weight)
    return w.size == 0 or int(np.abs(w.astype(np.int32)).max()) <= NARROW_WEIGHT


def check_weights(workload: Workload, weight: np.ndarray) -> None:
    """Refuse weights wider than a ``weights=narrow`` key promises (a kernel built for it would
    saturate: its sums would be wrong, not slow)."""
    if getattr(workload, "weights", "full") == "narrow" and not narrow_weights(weight):
        raise InvalidWorkloadError(
            f"{workload.op}: weights=narrow promises weights within +-{NARROW_WEIGHT}, got "
            f"{int(np.abs(np.asarray(weight).astype(np.int32)).max())}; use weights=full")


def can_saturate(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Per weight pair: whether some u8 data saturates its 16-bit sum of products."""
    a, b = first.astype(np.int32), second.astype(np.int32)
    high = np.maximum(a, 0) + np.maximum(b, 0)
    low = np.maximum(-a, 0) + np.maximum(-b, 0)
    return (high > _SAFE_PAIR) | (low > _SAFE_PAIR)


def saturated(pairs: np.ndarray) -> np.ndarray:
    """What ``weights=sat16`` takes from exact pair sums (int64): ``clip(p) - p``, at most 0
    above and at least 0 below."""
    return np.clip(pairs, INT16_MIN, INT16_MAX) - pairs


def sat16_correction(data: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """``[M, N]``: what saturating 16-bit pair sums take from the exact products of u8
    ``data[M, K]`` and s8 ``weight[N, K]`` (pairs 2j, 2j+1 along K; an odd K's last value
    pairs with a zero). Only pairs that some row can saturate are computed."""
    a, w = data.astype(np.int64), weight.astype(np.int64)
    if w.shape[1] % 2:
        a, w = np.pad(a, ((0, 0), (0, 1))), np.pad(w, ((0, 0), (0, 1)))
    corr = np.zeros((a.shape[0], w.shape[0]), dtype=np.int64)
    for j in np.flatnonzero(can_saturate(w[:, 0::2], w[:, 1::2]).any(axis=0)):
        corr += saturated(np.outer(a[:, 2 * j], w[:, 2 * j]) +
                          np.outer(a[:, 2 * j + 1], w[:, 2 * j + 1]))
    return corr


def quantized_inputs(rng: np.random.Generator | int, data_shape: Shape, weight_shape: Shape,
                     taps: int, channels: int, scale: str, bias: str, out: str,
                     weights: str = "full") -> dict[str, np.ndarray]:
    """Random inputs of a quantized layer (u8 data, s8 weights, within +-64 for
    ``weights=narrow``, zero points, fp32 scales for ``channels`` outputs or one, optional
    int32 bias) whose scale spreads the outputs of a ``taps``-long dot product over the
    quantized range, saturating a few."""
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    bound = NARROW_WEIGHT if weights == "narrow" else 127
    # 74 and 73 (37 narrow): the u8 and s8 values' root mean squares
    spread = float(np.sqrt(taps)) * 74.0 * (37.0 if weights == "narrow" else 73.0)
    typical = (40.0 if out != "f32" else 1.0) / spread
    count = channels if scale == "channel" else 1
    inputs: dict[str, np.ndarray] = {
        "data": gen.integers(0, 256, size=data_shape, dtype=np.uint8),
        "weight": gen.integers(-bound, bound + 1, size=weight_shape, dtype=np.int8),
        "data_zero_point": gen.integers(100, 157, size=(1,), dtype=np.uint8),
        "scale": (gen.uniform(0.5, 1.5, size=count) * typical).astype(np.float32),
    }
    if bias == "s32":
        inputs["bias"] = gen.integers(-int(spread), int(spread) + 1, size=(channels,)
                                      ).astype(np.int32)
    if out != "f32":
        lo, hi = (96, 160) if out == "u8" else (-16, 16)
        inputs["out_zero_point"] = gen.integers(lo, hi, size=(1,)).astype(QUANT_NUMPY[out])
    return inputs


def quantized_shapes(data: Shape, weight: Shape, channels: int, scale: str, bias: str,
                     out: str) -> dict[str, Shape]:
    """An int8 operator's inputs in call order; its ``channels`` output channels each have a
    scale (``scale=channel``) and a bias (``bias=s32``)."""
    shapes: dict[str, Shape] = {"data": data, "weight": weight, "data_zero_point": (1,),
                                "scale": (channels,) if scale == "channel" else (1,)}
    if bias == "s32":
        shapes["bias"] = (channels,)
    if out != "f32":
        shapes["out_zero_point"] = (1,)
    return shapes


def requantize(acc: np.ndarray, scale: np.ndarray, zero_point: int | None, out: str
               ) -> np.ndarray:
    """int32 accumulators -> outputs, as onnxruntime's QLinearMatMul rounds them: fp32
    ``acc * scale``, round half to even, add the zero point, saturate (``out=f32``: no
    rounding, the fp32 product itself)."""
    value = acc.astype(np.float32) * np.asarray(scale, dtype=np.float32)
    if out == "f32":
        return value.astype(np.float32)
    lo, hi = QUANT_RANGES[out]
    q = np.rint(value).astype(np.int64) + int(zero_point or 0)
    return np.clip(q, lo, hi).astype(QUANT_NUMPY[out])


def add_requantized(q: np.ndarray, inputs: Mapping[str, np.ndarray], out: str) -> np.ndarray:
    """A quantized addition of a per-column constant after an 8-bit output ``q`` (rows by
    columns), in the fp32 operations and order of the unfused ``DequantizeLinear`` x2 -> Add
    -> ``QuantizeLinear``: ``(float(q) - zp_in) * scale_in + add_value``, divided by
    ``scale_out``, rounded half to even, plus ``zp_out``, saturated to ``out``."""
    scales = np.asarray(inputs["add_scale"], np.float32).reshape(-1)
    zps = np.asarray(inputs["add_zero_point"]).reshape(-1).astype(np.float32)
    value = np.asarray(q).astype(np.float32)
    value -= zps[0]
    value *= scales[0]
    value += np.asarray(inputs["add_value"], np.float32).reshape(-1)
    lo, hi = QUANT_RANGES[out]
    rounded = np.rint(value / scales[1]) + zps[1]
    return np.clip(rounded, lo, hi).astype(QUANT_NUMPY[out])


@register
@dataclasses.dataclass(frozen=True)
class DenseInt8(Workload):
    """``out[M,N] = requantize((data[M,K] - zp) . weight[N,K]^T)``, u8 x s8 -> s32 (then, with
    ``add``, the fused quantized addition of a per-column constant)."""

    M: int
    N: int
    K: int
    out: str = "u8"
    scale: str = "channel"
    bias: str = "none"
    weights: str = "full"
    add: str = "none"

    op: ClassVar[str] = "dense_int8"
    params: ClassVar[dict[str, tuple[str, Any]]] = {
        "M": ("int", None),
        "N": ("int", None),
        "K": ("int", None),
        **QUANT_PARAMS,
        "add": ("choice", "none"),
    }
    choices: ClassVar[dict[str, tuple[str, ...]]] = {**QUANT_CHOICES,
                                                     "add": ("none", "u8", "s8")}
    constant_inputs: ClassVar[tuple[str, ...]] = (*QUANT_CONSTANTS, *ADD_INPUTS)
    examples: ClassVar[tuple[str, ...]] = (
        "dense_int8:M=6,N=32,K=12", "dense_int8:M=5,N=48,K=64,out=s8,scale=tensor",
        "dense_int8:M=4,N=16,K=8,out=f32", "dense_int8:M=3,N=20,K=10,bias=s32",
        "dense_int8:M=7,N=33,K=13,out=s8", "dense_int8:M=7,N=33,K=13,bias=s32,add=u8",
        "dense_int8:M=5,N=20,K=12,out=s8,scale=tensor,add=s8",
        "dense_int8:M=5,N=40,K=22,bias=s32,weights=narrow",
        "dense_int8:M=5,N=40,K=22,bias=s32,weights=sat16")

    def validate(self) -> None:
        if self.add != "none" and self.out == "f32":
            raise InvalidWorkloadError("dense_int8: a fused addition (add=...) follows an 8-bit "
                                       "output; out=f32 has none")

    def base_workload(self) -> Workload:
        """The product without the fused addition: the same search space and FLOPs (the
        addition changes only the output stage), so the same records serve both."""
        return self if self.add == "none" else dataclasses.replace(self, add="none")

    def input_shapes(self) -> dict[str, Shape]:
        shapes = quantized_shapes((self.M, self.K), (self.N, self.K), self.N, self.scale,
                                  self.bias, self.out)
        if self.add != "none":
            shapes.update(add_value=(self.N,), add_scale=(2,), add_zero_point=(2,))
        return shapes

    def output_shape(self) -> Shape:
        return (self.M, self.N)

    def flops(self) -> int:
        """Integer operations, counted like fp32 FLOPs so that throughputs compare."""
        return 2 * self.M * self.N * self.K

    def accumulate(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """The int32 accumulators, bias included (fp64 BLAS is exact here: every partial
        sum is an integer far below 2**53)."""
        data = np.asarray(inputs["data"], dtype=np.float64)
        zp = float(np.asarray(inputs["data_zero_point"]).reshape(-1)[0])
        weight = np.asarray(inputs["weight"], dtype=np.float64)
        acc = (data - zp) @ weight.T
        if self.weights == "sat16":
            acc += sat16_correction(np.asarray(inputs["data"]), np.asarray(inputs["weight"]))
        if self.bias == "s32":
            acc += np.asarray(inputs["bias"], dtype=np.float64).reshape(1, self.N)
        return acc.astype(np.int32)

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        zp = inputs.get("out_zero_point")
        zero_point = None if zp is None else int(np.asarray(zp).reshape(-1)[0])
        result = requantize(self.accumulate(inputs), np.asarray(inputs["scale"]).reshape(-1),
                            zero_point, self.out)
        return result if self.add == "none" else add_requantized(result, inputs, self.add)

    def make_inputs(self, rng: np.random.Generator | int = 0) -> dict[str, np.ndarray]:
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        inputs = quantized_inputs(gen, (self.M, self.K), (self.N, self.K), self.K, self.N,
                                  self.scale, self.bias, self.out, self.weights)
        if self.add != "none":  # a sum that moves the values by up to ~40 steps, some saturate
            lo, hi = (96, 160) if self.add == "u8" else (-16, 16)
            inputs["add_value"] = gen.uniform(-2.0, 2.0, size=self.N).astype(np.float32)
            inputs["add_scale"] = gen.uniform(0.04, 0.07, size=2).astype(np.float32)
            inputs["add_zero_point"] = np.array(
                [int(np.asarray(inputs["out_zero_point"]).reshape(-1)[0]),
                 int(gen.integers(lo, hi))], np.int32)
        return inputs

    def describe(self) -> str:
        bias = ", int32 bias" if self.bias == "s32" else ""
        add = f", then a quantized addition to {self.add}" if self.add != "none" else ""
        return (f"int8 dense {self.M}x{self.K} by {self.K}x{self.N} (u8 x s8 -> "
                f"{SUMS[self.weights]}{bias}, {self.scale} scale, {self.out} out{add})")


@register
@dataclasses.dataclass(frozen=True)
class DenseBf16(Workload):
    """``out[M,N] = bf16(data[M,K]) . bf16(weight[N,K])^T``, fp32 accumulation, then the
    epilogue; ``data`` is bfloat16 bits (``data=bf16``) or fp32 rounded in the kernel (``f32``)."""

    M: int
    N: int
    K: int
    data: str = "bf16"
    epilogue: Epilogue = NO_EPILOGUE

    op: ClassVar[str] = "dense_bf16"
    params: ClassVar[dict[str, tuple[str, Any]]] = {
        "M": ("int", None),
        "N": ("int", None),
        "K": ("int", None),
        "data": ("choice", "bf16"),
        "epilogue": ("epilogue", NO_EPILOGUE),
    }
    choices: ClassVar[dict[str, tuple[str, ...]]] = {"data": ("bf16", "f32")}
    constant_inputs: ClassVar[tuple[str, ...]] = ("weight", "scale", "bias")
    examples: ClassVar[tuple[str, ...]] = ("dense_bf16:M=6,N=32,K=10",
                                           "dense_bf16:M=3,N=48,K=64",
                                           "dense_bf16:M=19,N=32,K=6,data=f32,epilogue=bias+relu")

    def input_shapes(self) -> dict[str, Shape]:
        return {"data": (self.M, self.K), "weight": (self.N, self.K),
                **self.epilogue.input_shapes(self.output_shape())}

    def output_shape(self) -> Shape:
        return (self.M, self.N)

    def flops(self) -> int:
        return 2 * self.M * self.N * self.K

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        data = inputs["data"] if self.data == "bf16" else to_bfloat16(inputs["data"])
        weight = from_bfloat16(to_bfloat16(inputs["weight"])).astype(np.float64)
        out = (from_bfloat16(data).astype(np.float64) @ weight.T).astype(np.float32)
        return self.epilogue.apply(out, inputs)

    def make_inputs(self, rng: np.random.Generator | int = 0) -> dict[str, np.ndarray]:
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        inputs = super().make_inputs(gen)
        if self.data == "bf16":
            inputs["data"] = to_bfloat16(inputs["data"])
        return inputs

    def describe(self) -> str:
        source = "bf16" if self.data == "bf16" else "fp32 rounded to bf16"
        fused = f", fused {self.epilogue.describe()}" if self.epilogue else ""
        return (f"bf16 dense {self.M}x{self.K} by {self.K}x{self.N} ({source} data, fp32 "
                f"accumulation){fused}")


@register
@dataclasses.dataclass(frozen=True)
class BatchMatmulBf16(Workload):
    """``out[b,M,N] = bf16(x[b,M,K]) . bf16(y[b,K,N])``, fp32 accumulation: ``batch_matmul``
    (two activations, fp32 in and out, as a model built with ``--precision bf16`` has them in
    its attention) with both operands rounded to bfloat16 in the kernel."""

    B: int
    M: int
    N: int
    K: int

    op: ClassVar[str] = "batch_matmul_bf16"
    params: ClassVar[dict[str, tuple[str, Any]]] = {
        "B": ("int", None),
        "M": ("int", None),
        "N": ("int", None),
        "K": ("int", None),
    }
    constant_inputs: ClassVar[tuple[str, ...]] = ()
    examples: ClassVar[tuple[str, ...]] = ("batch_matmul_bf16:B=3,M=8,N=32,K=16",
                                           "batch_matmul_bf16:B=2,M=19,N=21,K=7",
                                           "batch_matmul_bf16:B=1,M=6,N=48,K=64")

    def input_shapes(self) -> dict[str, Shape]:
        return {"x": (self.B, self.M, self.K), "y": (self.B, self.K, self.N)}

    def output_shape(self) -> Shape:
        return (self.B, self.M, self.N)

    def flops(self) -> int:
        return 2 * self.B * self.M * self.N * self.K

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        x = from_bfloat16(to_bfloat16(inputs["x"])).astype(np.float64)
        y = from_bfloat16(to_bfloat16(inputs["y"])).astype(np.float64)
        return np.matmul(x, y).astype(np.float32)

    def describe(self) -> str:
        return (f"bf16 batch matmul {self.B} x ({self.M}x{self.K} by {self.K}x{self.N}) (fp32 "
                "operands rounded to bf16, fp32 accumulation)")
