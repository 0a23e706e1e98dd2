"""The addition of two 8-bit tensors as onnxruntime computes it (its fused ``QLinearAdd``, which
its graph optimizer also makes of ``DequantizeLinear`` x2 -> ``Add`` -> ``QuantizeLinear``).

MLAS's x86 kernel (AVX2 and newer) works on the raw 8-bit values with two fp32 ratios and one
constant per call, ``ratio_a = a_scale / y_scale``, ``ratio_b = b_scale / y_scale`` and
``constant = y_zero_point - fma(ratio_a, a_zero_point, ratio_b * b_zero_point)``, then per
element ``fma(a, ratio_a, fma(b, ratio_b, constant))``, rounded half to even and saturated. No
division and no zero-point subtraction per element, so it is cheaper than the unfused steps
(dequantize both, add, divide by ``y_scale``), and its bytes are onnxruntime's: the unfused
steps differ from them by one unit where the two roundings part (2 of 819,200 elements on
random operands, checked against onnxruntime 1.32 on an AVX2 host).

The fp32 fused multiply-adds are emulated in numpy through float64, where these products are
exact (an 8-bit value times an fp32 ratio needs 32 bits) and so is the sum for ratios within
2^+-20 of each other; the single rounding to fp32 is then the FMA's.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from schedule_templates.ir.nodes import Const, Expr, cast, fmax, fmin, intrinsic

#: the 8-bit element types and their ranges
RANGES = {"uint8": (0, 255), "int8": (-128, 127)}


@dataclasses.dataclass(frozen=True)
class FusedAdd:
    """The per-call constants of onnxruntime's quantized addition."""

    ratio_a: np.float32
    ratio_b: np.float32
    constant: np.float32

    @classmethod
    def of(cls, a_scale: float, a_zero_point: int, b_scale: float, b_zero_point: int,
           y_scale: float, y_zero_point: int) -> FusedAdd:
        f32 = np.float32
        ratio_a = f32(f32(a_scale) / f32(y_scale))
        ratio_b = f32(f32(b_scale) / f32(y_scale))
        inner = fma32(ratio_a, f32(a_zero_point), f32(ratio_b * f32(b_zero_point)))
        return cls(ratio_a, ratio_b, f32(f32(y_zero_point) - inner))

    def expr(self, a: Expr, b: Expr, dtype: str) -> Expr:
        """The kernel's element, with this call's constants in the code."""
        return fused_add_expr(a, b, (_f32(self.ratio_a), _f32(self.ratio_b),
                                     _f32(self.constant)), dtype)

    def numpy(self, a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
        value = fma32(np.asarray(b, np.float32), self.ratio_b, self.constant)
        value = fma32(np.asarray(a, np.float32), self.ratio_a, value)
        lo, hi = RANGES[dtype]
        return np.clip(np.rint(value), lo, hi).astype(dtype)


def fused_add_expr(a: Expr, b: Expr, constants: tuple[Expr, Expr, Expr], dtype: str) -> Expr:
    """``a`` and ``b`` (8-bit values, or integers of their range) added with ``constants``
    (ratio_a, ratio_b, constant: literals, or loads where the kernel takes them as arguments);
    the code generator contracts each ``p * q + r`` into an FMA, as the numpy form rounds."""
    ratio_a, ratio_b, constant = constants
    value = cast("float32", a) * ratio_a + (cast("float32", b) * ratio_b + constant)
    lo, hi = RANGES[dtype]
    clamped = fmin(fmax(value, _f32(lo)), _f32(hi))
    return cast(dtype, cast("int32", intrinsic("roundeven", clamped)))


def fma32(x: np.ndarray | np.float32, y: np.ndarray | np.float32,
          z: np.ndarray | np.float32) -> np.ndarray:
    """``x * y + z`` rounded once to fp32 (through float64, exact for the operands above)."""
    return np.asarray(np.float64(x) * np.float64(y) + np.float64(z)).astype(np.float32)


def _f32(value: float | np.float32) -> Expr:
    return Const(float(np.float32(value)), "float32")
