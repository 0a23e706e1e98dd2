"""CUDA template for ``group_conv2d`` (NCHW): one implicit GEMM per group, batched over the
grid's z axis, on the tiled SIMT GEMM of ``cuda_tiling``.

Group ``g`` is the GEMM ``C_g = A_g B_g`` with ``M = K/groups`` output channels as rows,
``N = batch * OH * OW`` pixels as columns and ``(c, r, s)`` over the group's ``C/groups`` input
channels as the reduction. The weights ``[K][C/g][R][S]`` already are the ``groups`` row-major
left operands; the right operand is gathered from the group's activations as the tiles are
loaded (``conv2d.cuda``'s im2col with a channel offset). The space is ``conv2d.cuda``'s GEMM
space over that per-group problem.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from schedule_templates.ir.nodes import Buffer, Const, Expr, Kernel, Load
from schedule_templates.space import Config, ConfigSpace
from schedule_templates.templates.base import Template, as_workload, register
from schedule_templates.templates.cuda_conv2d import im2col, pointwise
from schedule_templates.templates.cuda_tiling import (
    DeviceLimits,
    GemmProblem,
    GemmTiles,
    Operand,
    ceil_div,
    gemm_default,
    gemm_nest,
    gemm_space,
    vector_width,
)
from schedule_templates.templates.epilogue import epilogue_stage
from schedule_templates.workloads import GroupConv2d, Workload


def _gemm_shape(wl: GroupConv2d) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of the per-group GEMMs."""
    return wl.groups, wl.group_out, wl.N * wl.out_h * wl.out_w, wl.group_in * wl.R * wl.S


@register
class GroupConv2dCuda(Template):
    name = "group_conv2d.cuda"
    op = "group_conv2d"
    target_kind = "cuda"
    version = 1
    fuses_epilogue = True

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        return gemm_space(*_gemm_shape(as_workload(workload, GroupConv2d)), device)

    def default_config(self, workload: Workload) -> Config:
        """The classic tiles, shrunk until the grid has a block for every multiprocessor: a
        group's GEMM is small (ResNeXt: 8 rows), so big tiles would leave most SMs idle."""
        groups, M, N, _ = _gemm_shape(as_workload(workload, GroupConv2d))
        sms = DeviceLimits().multiprocessor_count

        def enough(t: GemmTiles) -> bool:
            return groups * ceil_div(M, t.bm) * ceil_div(N, t.bn) >= sms

        return gemm_default(self.space(workload), enough)

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = as_workload(workload, GroupConv2d)
        groups, M, N, K = _gemm_shape(wl)
        pixels = wl.out_h * wl.out_w
        weight = Buffer("weight", (groups, M, K))  # the layout of [K][C/g][R][S]
        out = Buffer("out", (wl.N, wl.K, pixels))
        stage = epilogue_stage(wl)
        if stage.residual is not None:  # indexed like the output, pixels flattened
            stage = dataclasses.replace(stage, residual=Buffer("residual", out.shape))
        if pointwise(wl):
            data = Buffer("data", (wl.C, pixels))
            right = Operand(N, "mn", vector_width(N),
                            lambda g, p, c: data[g * wl.group_in + c, p])
        else:
            data = Buffer("data", (wl.N, wl.C, wl.H, wl.W))
            right = Operand(N, "mn", 1, lambda g, p, crs: im2col(wl, data, p, crs,
                                                                    g * wl.group_in))

        def pixel(p: Expr) -> tuple[Expr, Expr]:
            return (Const(0), p) if wl.N == 1 else (p // pixels, p % pixels)

        def finish(value: Expr, g: Expr, m: Expr, p: Expr) -> Expr:
            n, q = pixel(p)
            channel = g * M + m
            return stage.apply(value, channel, (n, channel, q))

        def target(g: Expr, m: Expr, p: Expr) -> Load:
            n, q = pixel(p)
            return out[n, g * M + m, q]

        problem = GemmProblem(
            groups, M, N, K,
            a=Operand(M, "k", vector_width(K), lambda g, m, k: weight[g, m, k]),
            b=right, out=target, finish=finish,
        )
        body = gemm_nest(GemmTiles.of(config), problem)
        return Kernel("group_conv2d_cuda", (data, weight, *stage.buffers, out), (), (body,))
