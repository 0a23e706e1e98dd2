"""CUDA templates for ``dense`` and ``batch_matmul``: the shared-memory tiled SIMT GEMM of
``cuda_tiling`` on the operands as they lie in memory (no packing).

dense: ``out[m, n] = sum_k data[m, k] * weight[n, k]``: both operands are contiguous along k,
so both tiles are read with vector loads along k and transposed into shared memory.
batch_matmul: ``out[b, m, n] = sum_k x[b, m, k] * y[b, k, n]``: ``y`` is contiguous along n and
is copied into shared memory as it is; the batch is the grid's z dimension.
A fused epilogue (bias, scale, ReLU...) is applied to the accumulator as it is stored.
"""

from __future__ import annotations

from collections.abc import Mapping

from schedule_templates.ir.nodes import Buffer, Expr, Kernel
from schedule_templates.space import Config, ConfigSpace
from schedule_templates.templates.base import Template, as_workload, register
from schedule_templates.templates.cuda_tiling import (
    GemmProblem,
    GemmTiles,
    Operand,
    gemm_default,
    gemm_nest,
    gemm_space,
    vector_width,
)
from schedule_templates.templates.epilogue import epilogue_stage
from schedule_templates.workloads import BatchMatmul, Dense, Workload


@register
class DenseCuda(Template):
    name = "dense.cuda"
    op = "dense"
    target_kind = "cuda"
    version = 1
    fuses_epilogue = True

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = as_workload(workload, Dense)
        return gemm_space(1, wl.M, wl.N, wl.K, device)

    def default_config(self, workload: Workload) -> Config:
        return gemm_default(self.space(workload))

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = as_workload(workload, Dense)
        data = Buffer("data", (wl.M, wl.K))
        weight = Buffer("weight", (wl.N, wl.K))
        out = Buffer("out", (wl.M, wl.N))
        epilogue = epilogue_stage(wl)
        vec = vector_width(wl.K)

        def finish(value: Expr, _b: Expr, m: Expr, n: Expr) -> Expr:
            return epilogue.apply(value, n, (m, n))

        problem = GemmProblem(
            1, wl.M, wl.N, wl.K,
            a=Operand(wl.M, "k", vec, lambda _b, m, k: data[m, k]),
            b=Operand(wl.N, "k", vec, lambda _b, n, k: weight[n, k]),
            out=lambda _b, m, n: out[m, n],
            finish=finish,
        )
        body = gemm_nest(GemmTiles.of(config), problem)
        return Kernel("dense_cuda", (data, weight, *epilogue.buffers, out), (), (body,))


@register
class BatchMatmulCuda(Template):
    name = "batch_matmul.cuda"
    op = "batch_matmul"
    target_kind = "cuda"
    version = 1

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = as_workload(workload, BatchMatmul)
        return gemm_space(wl.B, wl.M, wl.N, wl.K, device)

    def default_config(self, workload: Workload) -> Config:
        return gemm_default(self.space(workload))

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = as_workload(workload, BatchMatmul)
        x = Buffer("x", (wl.B, wl.M, wl.K))
        y = Buffer("y", (wl.B, wl.K, wl.N))
        out = Buffer("out", (wl.B, wl.M, wl.N))
        problem = GemmProblem(
            wl.B, wl.M, wl.N, wl.K,
            a=Operand(wl.M, "k", vector_width(wl.K), lambda b, m, k: x[b, m, k]),
            b=Operand(wl.N, "mn", vector_width(wl.N), lambda b, n, k: y[b, k, n]),
            out=lambda b, m, n: out[b, m, n],
            finish=lambda value, _b, _m, _n: value,
        )
        body = gemm_nest(GemmTiles.of(config), problem)
        return Kernel("batch_matmul_cuda", (x, y, out), (), (body,))
