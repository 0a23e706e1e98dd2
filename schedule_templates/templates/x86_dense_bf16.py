"""x86 template for ``dense_bf16``: AVX-512 BF16 register tiles, fp32 accumulation.

Weights are rounded to bfloat16 once at pack time (nearest even) and packed in pairs along K;
activations are read two at a time as one 32-bit word, broadcast, and ``vdpbf16ps`` adds both
products of each pair into an fp32 lane (``x86_dot_gemm``'s nest). Against fp32 FMAs that is
twice the multiplies per instruction and half the bytes: on CPUs whose BF16 unit issues like
their FMAs (AMD Zen 4/5) a compute-bound layer runs up to twice as fast, on others (Intel Xeon
before AMX) at half speed, so ``bench/kernels.py`` measures both before a model is built so.

bfloat16 activations (``data=bf16``) are only reinterpreted as words. fp32 activations
(``data=f32``, a model built with ``--precision bf16``) are first rounded into a workspace of
words, one parallel pass over the rows (M x K, small next to the M x N x K products). That
workspace has room for M rounded up as ``dense`` rounds it (``padded_extent``: ViT's 197 tokens
are computed as 200 rows, the extra ones never stored), so a prime M does not force one-row
register tiles. A fused epilogue is computed in fp32 on the finished sums, as ``dense``'s is.

On hosts with AMX-BF16 a layer with whole 32-column register blocks runs on tiles
(``x86_amx_gemm``, ``tdpbf16ps``: 16 rows x 32 values x 16 columns a step) with the same
epilogue.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from schedule_templates.ir.nodes import Buffer, Expr, Kernel, Scope, Stmt, cast, store
from schedule_templates.space import Config, ConfigSpace
from schedule_templates.templates import x86_amx_gemm
from schedule_templates.templates.base import Template, register
from schedule_templates.templates.base import as_workload as _as
from schedule_templates.templates.epilogue import epilogue_arguments, epilogue_stage
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
from schedule_templates.templates.x86_gemm import padded_extent
from schedule_templates.templates.x86_int8_stages import word_rows
from schedule_templates.workloads import DenseBf16, Workload
from schedule_templates.workloads.lowp import to_bfloat16


@register
class DenseBf16X86(Template):
    name = "dense_bf16.x86"
    op = "dense_bf16"
    target_kind = "llvm"
    version = 1
    fuses_epilogue = True

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = _as(workload, DenseBf16)
        check_shape(wl.op, wl.N, wl.K, BF16)
        return dot_space(_rows(wl), wl.N, wl.K, BF16)

    def default_config(self, workload: Workload) -> Config:
        wl = _as(workload, DenseBf16)
        return dot_default(self.space(wl), _rows(wl), wl.N, wl.K, BF16)

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = _as(workload, DenseBf16)
        plan = x86_amx_gemm.amx_blocking(config, wl.M, wl.N) if _on_tiles(wl) else None
        if plan is None:
            nr, words, rows_computed = config["tile_n"][2], wl.K // 2, _rows(wl)
        else:  # rows padded to whole register blocks, K to whole tile steps (+0.0 past K:
            # a NaN from stale bits would not vanish in a product with a zero weight)
            nr, words, rows_computed = 16, x86_amx_gemm.padded_words(wl.K, 2), plan.M
        stages: list[Stmt] = []
        workspaces: list[Buffer] = []
        if wl.data == "bf16":
            data = Buffer("data", (wl.M, words), dtype="int32")  # 2 bf16 per word
            rows = data
        else:
            data = Buffer("data", (wl.M, wl.K))
            rows = Buffer("data_words", (rows_computed, words), Scope.WORKSPACE, "int32")
            workspaces.append(rows)
            stages.append(word_rows(lambda m, w: rows[m, w],
                                    lambda m, k: cast("int32", cast("bfloat16", data[m, k])),
                                    wl.M, wl.K, words, BF16))
        packed = Buffer("weight_packed", (wl.N // nr, words, nr), dtype="int32")
        out = Buffer("out", (wl.M, wl.N))
        epilogue = epilogue_stage(wl)

        def finish(acc: Expr, m: Expr, n: Expr) -> Stmt:
            return store(out[m, n], epilogue.apply(acc, n, (m, n)) if wl.epilogue else acc)

        if plan is not None:
            operands = x86_amx_gemm.dense_operands("tdpbf16ps", rows, packed, words)
            stages.append(x86_amx_gemm.amx_nest(plan, operands, "float32", finish, wl.M))
        else:
            partial = partial_buffer(config, rows_computed, wl.N, BF16)
            stages.append(dot_nest(config, BF16, a=lambda m, kg: rows[m, kg],
                                   b=lambda p, kg, j: packed[p, kg, j], finish=finish,
                                   partial=partial, hint_b=True,
                                   rows=None if rows_computed == wl.M else wl.M))
            if partial is not None:
                workspaces.append(partial)
        name = "dense_bf16_x86" if plan is None else "dense_bf16_amx"
        return Kernel(name, (data, packed, *epilogue.buffers, out), tuple(workspaces),
                      tuple(stages))

    def pack(self, workload: Workload, config: Config, inputs: Mapping[str, np.ndarray]
             ) -> dict[str, np.ndarray]:
        wl = _as(workload, DenseBf16)
        nr = config["tile_n"][2]
        weight = to_bfloat16(np.asarray(inputs["weight"], dtype=np.float32))
        if _on_tiles(wl):  # panels of 16 columns, K padded with +0.0 to whole tile steps
            words = x86_amx_gemm.padded_words(wl.K, 2)
            weight = np.pad(weight, ((0, 0), (0, 2 * words - wl.K)))
            nr = 16
        packed = as_words(pack_panels(weight, nr, 2)).reshape(wl.N // nr, -1, nr)
        # bf16 activations are only reinterpreted (the same bits as words), not transformed
        data = (as_words(typed(inputs, "data", np.uint16)) if wl.data == "bf16"
                else np.asarray(inputs["data"], dtype=np.float32))
        return {"data": data, "weight_packed": packed, **epilogue_arguments(wl, inputs)}


def _on_tiles(wl: DenseBf16) -> bool:
    """AMX where the host has it, for whole register blocks of columns; bf16 activations are
    read in place, so only in whole blocks of rows and tile steps of K."""
    if wl.N % x86_amx_gemm.BLOCK_COLS or not x86_amx_gemm.host_amx("tdpbf16ps"):
        return False
    return wl.data == "f32" or _bf16_in_place(wl)


def _bf16_in_place(wl: DenseBf16) -> bool:
    plan_m = x86_amx_gemm.amx_blocking_rows(wl.M)
    return wl.data == "bf16" and plan_m == wl.M and wl.K % (2 * x86_amx_gemm.TILE_WORDS) == 0


def _rows(wl: DenseBf16) -> int:
    """Rows the nest computes: fp32 activations are staged, so M may be rounded up."""
    return padded_extent(wl.M) if wl.data == "f32" else wl.M
