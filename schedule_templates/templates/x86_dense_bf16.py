"""x86 template for ``dense_bf16``: AVX-512 BF16 register tiles, fp32 accumulation.

Weights are rounded to bfloat16 once at pack time (nearest even) and packed in pairs along K;
activations arrive as bfloat16 and are read two at a time as one 32-bit word, broadcast, and
``vdpbf16ps`` adds both products of each pair into an fp32 lane (``x86_dot_gemm``'s nest).
Against fp32 FMAs that is twice the multiplies per instruction and half the bytes.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from schedule_templates.ir.nodes import Buffer, Expr, Kernel, Stmt, store
from schedule_templates.space import Config, ConfigSpace
from schedule_templates.templates.base import Template, register
from schedule_templates.templates.base import as_workload as _as
from schedule_templates.templates.x86_dot_gemm import (
    BF16,
    as_words,
    check_shape,
    dot_default,
    dot_nest,
    dot_space,
    pack_panels,
    partial_buffer,
    typed,
)
from schedule_templates.workloads import DenseBf16, Workload
from schedule_templates.workloads.lowp import to_bfloat16


@register
class DenseBf16X86(Template):
    name = "dense_bf16.x86"
    op = "dense_bf16"
    target_kind = "llvm"
    version = 1

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = _as(workload, DenseBf16)
        check_shape(wl.op, wl.N, wl.K, BF16)
        return dot_space(wl.M, wl.N, wl.K, BF16)

    def default_config(self, workload: Workload) -> Config:
        wl = _as(workload, DenseBf16)
        return dot_default(self.space(wl), wl.M, wl.N, wl.K, BF16)

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = _as(workload, DenseBf16)
        nr = config["tile_n"][2]
        data = Buffer("data", (wl.M, wl.K // 2), dtype="int32")  # 2 bf16 per word
        packed = Buffer("weight_packed", (wl.N // nr, wl.K // 2, nr), dtype="int32")
        out = Buffer("out", (wl.M, wl.N))

        def finish(acc: Expr, m: Expr, n: Expr) -> Stmt:
            return store(out[m, n], acc)

        partial = partial_buffer(config, wl.M, wl.N, BF16)
        body = dot_nest(config, BF16, a=lambda m, kg: data[m, kg],
                        b=lambda p, kg, j: packed[p, kg, j], finish=finish, partial=partial)
        return Kernel("dense_bf16_x86", (data, packed, out),
                      () if partial is None else (partial,), (body,))

    def pack(self, workload: Workload, config: Config, inputs: Mapping[str, np.ndarray]
             ) -> dict[str, np.ndarray]:
        wl = _as(workload, DenseBf16)
        nr = config["tile_n"][2]
        weight = to_bfloat16(np.asarray(inputs["weight"], dtype=np.float32))
        packed = as_words(pack_panels(weight, nr, 2)).reshape(wl.N // nr, wl.K // 2, nr)
        # activations are only reinterpreted (the same bits as words), not transformed
        return {"data": as_words(typed(inputs, "data", np.uint16)),
                "weight_packed": packed}
