"""x86 template for ``dense_int8``: AVX-512 VNNI register tiles with requantization fused.

Each step of the reduction broadcasts 4 bytes of an activation row as one 32-bit word and
``vpdpbusd`` multiplies them with 16 columns' 4 packed weight bytes, adding into int32 lanes
(the loop nest is ``x86_dot_gemm``'s). The activation zero point is folded in at pack time:
``sum((a - zp) * w) = sum(a * w) - zp * sum(w)``, the second term one int32 per column, so the
hot loop sees raw bytes. The output stage converts to fp32, scales, clamps to the output range
less its zero point, rounds half to even, adds the zero point and narrows: onnxruntime's
QLinearMatMul rounding (clamping before rounding gives the same integers as after, since the
bounds are integers) without an integer overflow on the way. AMX tiles are a later step.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from schedule_templates.ir.nodes import (
    Buffer,
    Const,
    Expr,
    Kernel,
    Stmt,
    cast,
    fmax,
    fmin,
    intrinsic,
    store,
)
from schedule_templates.space import Config, ConfigSpace
from schedule_templates.templates.base import Template, register
from schedule_templates.templates.base import as_workload as _as
from schedule_templates.templates.x86_dot_gemm import (
    VNNI,
    as_words,
    check_shape,
    dot_default,
    dot_nest,
    dot_space,
    pack_panels,
    partial_buffer,
    typed,
)
from schedule_templates.workloads import DenseInt8, Workload
from schedule_templates.workloads.lowp import QUANT_RANGES

_OUT_DTYPES = {"u8": "uint8", "s8": "int8", "f32": "float32"}


@register
class DenseInt8X86(Template):
    name = "dense_int8.x86"
    op = "dense_int8"
    target_kind = "llvm"
    version = 1

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = _as(workload, DenseInt8)
        check_shape(wl.op, wl.N, wl.K, VNNI)
        return dot_space(wl.M, wl.N, wl.K, VNNI)

    def default_config(self, workload: Workload) -> Config:
        wl = _as(workload, DenseInt8)
        return dot_default(self.space(wl), wl.M, wl.N, wl.K, VNNI)

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = _as(workload, DenseInt8)
        nr = config["tile_n"][2]
        data = Buffer("data", (wl.M, wl.K // 4), dtype="int32")  # 4 u8 per word
        packed = Buffer("weight_packed", (wl.N // nr, wl.K // 4, nr), dtype="int32")
        compensation = Buffer("compensation", (wl.N,), dtype="int32")
        scale = Buffer("scale", (wl.N,) if wl.scale == "channel" else (1,))
        zero_point = Buffer("out_zero_point", (1,), dtype="int32")
        out = Buffer("out", (wl.M, wl.N), dtype=_OUT_DTYPES[wl.out])

        def finish(acc: Expr, m: Expr, n: Expr) -> Stmt:
            value = cast("float32", acc + compensation[n]) * scale[n if wl.scale == "channel"
                                                                   else 0]
            if wl.out == "f32":
                return store(out[m, n], value)
            lo, hi = QUANT_RANGES[wl.out]
            zp = cast("float32", zero_point[0])
            clamped = fmin(fmax(value, Const(float(lo), "float32") - zp),
                           Const(float(hi), "float32") - zp)
            q = cast("int32", intrinsic("roundeven", clamped)) + zero_point[0]
            return store(out[m, n], cast(out.dtype, q))

        partial = partial_buffer(config, wl.M, wl.N, VNNI)
        body = dot_nest(config, VNNI, a=lambda m, kg: data[m, kg],
                        b=lambda p, kg, j: packed[p, kg, j], finish=finish, partial=partial)
        params = (data, packed, compensation, scale,
                  *(() if wl.out == "f32" else (zero_point,)), out)
        return Kernel("dense_int8_x86", params, () if partial is None else (partial,), (body,))

    def pack(self, workload: Workload, config: Config, inputs: Mapping[str, np.ndarray]
             ) -> dict[str, np.ndarray]:
        wl = _as(workload, DenseInt8)
        nr = config["tile_n"][2]
        weight = typed(inputs, "weight", np.int8)
        data_zp = int(typed(inputs, "data_zero_point", np.uint8).reshape(-1)[0])
        packed = as_words(pack_panels(weight, nr, 4)).reshape(wl.N // nr, wl.K // 4, nr)
        args = {
            # activations are only reinterpreted (the same bytes as words), not transformed
            "data": as_words(typed(inputs, "data", np.uint8)),
            "weight_packed": packed,
            "compensation": compensation(wl, inputs, weight, data_zp),
            "scale": np.asarray(inputs["scale"], dtype=np.float32),
        }
        if wl.out != "f32":
            zp_type = np.uint8 if wl.out == "u8" else np.int8
            args["out_zero_point"] = typed(inputs, "out_zero_point", zp_type).astype(np.int32)
        return args


def compensation(wl: DenseInt8, inputs: Mapping[str, np.ndarray], weight: np.ndarray,
                 data_zp: int) -> np.ndarray:
    """What each column adds to its raw-byte accumulator: ``-zp * sum(w)``, plus the int32
    bias when the workload has one."""
    total = -data_zp * weight.sum(axis=1, dtype=np.int64)
    if wl.bias == "s32":
        total = total + typed(inputs, "bias", np.int32).astype(np.int64)
    return total.astype(np.int32)
