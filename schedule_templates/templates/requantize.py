"""The output stage every int8 template shares, whatever its target: requantization of the
int32 accumulators (onnxruntime's rounding), the per-channel compensation that folds the
activation zero point and the int32 bias into one add, and the fused quantized addition of a
per-column constant (``dense_int8``'s ``add``). Pure IR: the x86 and CUDA templates emit it
alike.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from schedule_templates.ir.nodes import (
    Buffer,
    Const,
    Expr,
    Load,
    cast,
    fmax,
    fmin,
    intrinsic,
)
from schedule_templates.quant_add import fused_add_expr
from schedule_templates.templates.x86_dot_gemm import typed
from schedule_templates.workloads.lowp import QUANT_RANGES

OUT_DTYPES = {"u8": "uint8", "s8": "int8", "f32": "float32"}


def requantized(acc: Expr, scale: Expr, zero_point: Load, out: str) -> Expr:
    """The output stage: int32 ``acc`` scaled in fp32, then (u8/s8 out) clamped to the range
    less the zero point, rounded half to even, shifted by the zero point and narrowed."""
    if out == "f32":
        return cast("float32", acc) * scale
    return cast(OUT_DTYPES[out], requantized_int(acc, scale, zero_point, out))


def requantized_int(acc: Expr, scale: Expr, zero_point: Load, out: str) -> Expr:
    """The u8/s8 output value as an int32 of the type's range (before narrowing)."""
    value = cast("float32", acc) * scale
    lo, hi = QUANT_RANGES[out]
    zp = cast("float32", zero_point)
    clamped = fmin(fmax(value, Const(float(lo), "float32") - zp),
                   Const(float(hi), "float32") - zp)
    return cast("int32", intrinsic("roundeven", clamped)) + zero_point


class ResidualBuffers:
    """``conv2d_int8``'s fused shortcut addition (``residual=u8|s8``): the other operand, of the
    output's shape, and ``[ratio_a, ratio_b, constant]`` (``quant_add.FusedAdd``)."""

    def __init__(self, shape: tuple[int, ...], dtype: str) -> None:
        self.dtype = OUT_DTYPES[dtype]
        self.residual = Buffer("residual", shape, dtype=self.dtype)
        self.constants = Buffer("residual_add", (3,))
        self.params = (self.residual, self.constants)

    def expr(self, q: Expr, residual: Expr) -> Expr:
        """The layer's 8-bit value ``q`` plus ``residual`` (a load of the other operand)."""
        c = self.constants
        return fused_add_expr(q, residual, (c[0], c[1], c[2]), self.dtype)

    @staticmethod
    def pack(inputs: Mapping[str, np.ndarray], residual: str) -> dict[str, np.ndarray]:
        """The kernel arguments of ``residual=u8|s8`` (none for ``none``)."""
        if residual == "none":
            return {}
        return {"residual": typed(inputs, "residual",
                                  np.uint8 if residual == "u8" else np.int8),
                "residual_add": np.asarray(inputs["residual_add"], np.float32).reshape(3)}


class AddBuffers:
    """The fused addition's arguments: the constant negated (``x - (-c)``: the code generator
    contracts ``p * q + r`` into an FMA, which rounds once where the glue kernel rounds twice;
    negating is exact), [input scale, output scale] and [input zero point, output zero point]."""

    def __init__(self, columns: int) -> None:
        self.negated = Buffer("add_negated", (columns,))
        self.scales = Buffer("add_scale", (2,))
        self.zero_points = Buffer("add_zero_point", (2,), dtype="int32")
        self.params = (self.negated, self.scales, self.zero_points)

    def expr(self, q: Expr, n: Expr, out: str) -> Expr:
        """The 8-bit ``q`` dequantized, plus the constant, quantized to ``out``: the glue's
        ``(float(q) - zp) * scale``, then ``sum / scale_out`` clamped to the range less the
        zero point, rounded half to even, plus the zero point."""
        x = (cast("float32", q) - cast("float32", self.zero_points[0])) * self.scales[0]
        value = x - self.negated[n]
        lo, hi = QUANT_RANGES[out]
        zp = cast("float32", self.zero_points[1])
        scaled = value / self.scales[1]
        clamped = fmin(fmax(scaled, Const(float(lo), "float32") - zp),
                       Const(float(hi), "float32") - zp)
        return cast(OUT_DTYPES[out], cast("int32", intrinsic("roundeven", clamped))
                    + self.zero_points[1])

    @staticmethod
    def pack(inputs: Mapping[str, np.ndarray], columns: int) -> dict[str, np.ndarray]:
        value = np.asarray(inputs["add_value"], dtype=np.float32).reshape(-1)
        return {"add_negated": pad_to(-value, columns),
                "add_scale": np.asarray(inputs["add_scale"], np.float32).reshape(2),
                "add_zero_point": np.asarray(inputs["add_zero_point"]).astype(np.int32
                                                                              ).reshape(2)}


def compensation(bias: str, inputs: Mapping[str, np.ndarray], weight: np.ndarray,
                 data_zp: int) -> np.ndarray:
    """What each output channel adds to its raw-byte accumulator: ``-zp * sum(w)`` over its
    weights (any shape, channel first), plus the int32 bias when there is one."""
    total = -data_zp * weight.reshape(weight.shape[0], -1).sum(axis=1, dtype=np.int64)
    if bias == "s32":
        total = total + typed(inputs, "bias", np.int32).astype(np.int64)
    return total.astype(np.int32)


def pad_to(values: np.ndarray, size: int) -> np.ndarray:
    """``values`` (1-D) extended with zeros to ``size``."""
    padded = np.zeros(size, dtype=values.dtype)
    padded[:values.size] = values
    return padded
