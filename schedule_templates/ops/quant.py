"""Quantized elementwise addition: ``QuantizedAdd`` for the residual adds of int8 models.

The model compiler rewrites ``DequantizeLinear(a) + DequantizeLinear(b) [-> Relu] ->
QuantizeLinear`` into one node (``frontend/quantized_glue.py``); this is its kernel. It does
the same fp32 operations in the same order as onnx's unfused evaluation, so its bytes equal
``reference`` (and numpy's) exactly: each operand ``(float(x) - zero_point) * scale``, their
sum (kept apart from the products: see ``lower``), ``max(sum, 0)`` for the fused Relu, then
``sum / y_scale`` clamped to the output type's range less the zero point, rounded half to
even, plus the zero point.

The operands are 8-bit (``uint8`` or ``int8``), of one shape (the model compiler leaves a
broadcasting add to numpy); scales and zero points are per tensor and part of the operator, so
they are compiled in as constants. One flat walk over the elements, in 16-lane pieces, threaded
over blocks when there is enough work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from schedule_templates.ir.nodes import (
    Buffer,
    Const,
    Expr,
    Kernel,
    LoopKind,
    cast,
    fmax,
    fmin,
    intrinsic,
    loop,
    store,
)
from schedule_templates.ops.base import GeneratedOp, GeneratedOpError, Shape, register_op
from schedule_templates.ops.loops import BLOCK, kernel_name, vector_split, want_parallel

#: the 8-bit element types and their ranges
RANGES = {"uint8": (0, 255), "int8": (-128, 127)}


@register_op
@dataclasses.dataclass(frozen=True)
class QuantizedAdd(GeneratedOp):
    kind = "int8_add"
    size: int
    a_dtype: str
    a_scale: float
    a_zero_point: int
    b_dtype: str
    b_scale: float
    b_zero_point: int
    out_dtype: str
    y_scale: float
    y_zero_point: int
    relu: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or self.size < 1:
            raise GeneratedOpError(f"int8_add: size must be a positive integer, got {self.size!r}")
        for side in ("a", "b", "out"):
            dtype = getattr(self, f"{side}_dtype")
            if dtype not in RANGES:
                raise GeneratedOpError(f"int8_add: {side} must be uint8 or int8, got {dtype!r}")
        for side, dtype in (("a", self.a_dtype), ("b", self.b_dtype), ("y", self.out_dtype)):
            scale, zero_point = getattr(self, f"{side}_scale"), getattr(self, f"{side}_zero_point")
            if not (np.isfinite(scale) and scale > 0):
                raise GeneratedOpError(f"int8_add: {side}_scale must be positive, got {scale!r}")
            lo, hi = RANGES[dtype]
            if not isinstance(zero_point, int) or not lo <= zero_point <= hi:
                raise GeneratedOpError(f"int8_add: {side}_zero_point {zero_point!r} is outside "
                                       f"{dtype}")

    def input_shapes(self) -> dict[str, Shape]:
        return {"a": (self.size,), "b": (self.size,)}

    def input_dtypes(self) -> dict[str, str]:
        return {"a": self.a_dtype, "b": self.b_dtype}

    def output_shape(self) -> Shape:
        return (self.size,)

    def lower(self) -> Kernel:
        a = Buffer("a", (self.size,), dtype=self.a_dtype)
        b = Buffer("b", (self.size,), dtype=self.b_dtype)
        out = Buffer("out", (self.size,), dtype=self.out_dtype)

        def element(index: Expr, _lane: Expr) -> list:
            # x - (-y), not x + y: the code generator contracts ``p * q + r`` into an FMA,
            # which rounds once where numpy rounds twice (seen: 79.49999 became 79.5 and
            # rounded to the next output step). Negating a product is exact.
            value = (_dequantized(a[index], self.a_zero_point, self.a_scale)
                     - (_f32(self.b_zero_point) - cast("float32", b[index]))
                     * _f32(self.b_scale))
            if self.relu:
                value = fmax(value, _f32(0.0))
            return [store(out[index], self._quantized(value))]

        blocks, tail = divmod(self.size, BLOCK)
        body: list = []
        if blocks:
            kind = LoopKind.PARALLEL if want_parallel(self.size, blocks) else LoopKind.SERIAL
            block, mk = loop("blk", blocks, kind)
            body.append(mk(vector_split(BLOCK, block * BLOCK, element)))
        if tail:
            body += vector_split(tail, blocks * BLOCK, element, name="t")
        return Kernel(kernel_name(self.kind, self.key), (a, b, out), (), tuple(body))

    def _quantized(self, value: Expr) -> Expr:
        lo, hi = RANGES[self.out_dtype]
        zp = self.y_zero_point
        scaled = value / _f32(self.y_scale)
        clamped = fmin(fmax(scaled, _f32(lo - zp)), _f32(hi - zp))
        rounded = cast("int32", intrinsic("roundeven", clamped))
        return cast(self.out_dtype, rounded + Const(zp, "int32"))

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        a = _numpy_dequantized(inputs["a"], self.a_zero_point, self.a_scale)
        b = _numpy_dequantized(inputs["b"], self.b_zero_point, self.b_scale)
        value = a + b
        if self.relu:
            np.maximum(value, np.float32(0), out=value)
        value = np.rint(value / np.float32(self.y_scale)) + np.float32(self.y_zero_point)
        lo, hi = RANGES[self.out_dtype]
        return np.clip(value, lo, hi).astype(self.out_dtype).reshape(self.output_shape())


def _f32(value: float) -> Expr:
    return Const(float(np.float32(value)), "float32")


def _dequantized(value: Expr, zero_point: int, scale: float) -> Expr:
    return (cast("float32", value) - _f32(zero_point)) * _f32(scale)


def _numpy_dequantized(x: np.ndarray, zero_point: int, scale: float) -> np.ndarray:
    value = np.asarray(x).reshape(-1).astype(np.float32)
    value -= np.float32(zero_point)
    value *= np.float32(scale)
    return value
