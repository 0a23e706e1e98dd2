"""CUDA template for ``conv2d`` (NCHW): an implicit GEMM on the tiled SIMT GEMM of
``cuda_tiling``.

The output channels are the GEMM's rows (``M = K``), the output pixels of every image its
columns (``N = batch * OH * OW``) and ``(c, r, s)`` its reduction (``C * R * S``). The weights
``[K][C][R][S]`` already are the row-major left operand; the right operand is gathered from the
activations on the fly as the tiles are loaded (im2col without the copy): padding reads a
clamped address and is zeroed. Pixels are the contiguous axis of the output, so stores
coalesce; a 1x1, stride-1, unpadded convolution of one image reads activations with vector
loads too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from schedule_templates.ir.nodes import (
    Buffer,
    Const,
    Expr,
    ExprLike,
    Kernel,
    Load,
    Select,
    binop,
)
from schedule_templates.space import Config, ConfigSpace
from schedule_templates.templates.base import Template, as_workload, register
from schedule_templates.templates.cuda_tiling import (
    GemmProblem,
    GemmTiles,
    Operand,
    gemm_nest,
    gemm_space,
    small_grid_default,
    vector_width,
)
from schedule_templates.templates.epilogue import epilogue_stage
from schedule_templates.workloads import Conv2d, Workload
from schedule_templates.workloads.conv import _Window

ZERO = Const(0.0, "float32")


def _gemm_shape(wl: Conv2d) -> tuple[int, int, int]:
    return wl.K, wl.N * wl.out_h * wl.out_w, wl.C * wl.R * wl.S


def pointwise(wl: _Window) -> bool:
    """A 1x1 stride-1 unpadded convolution of one image: activations are ``[C][pixels]``."""
    return (wl.R == wl.S == 1 and wl.stride == (1, 1) and not any(wl.pad) and wl.N == 1)


@register
class Conv2dCuda(Template):
    name = "conv2d.cuda"
    op = "conv2d"
    target_kind = "cuda"
    version = 1
    fuses_epilogue = True

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        M, N, K = _gemm_shape(as_workload(workload, Conv2d))
        return gemm_space(1, M, N, K, device)

    def default_config(self, workload: Workload) -> Config:
        M, N, _ = _gemm_shape(as_workload(workload, Conv2d))
        return small_grid_default(self.space(workload), M, N)

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = as_workload(workload, Conv2d)
        M, N, K = _gemm_shape(wl)
        pixels = wl.out_h * wl.out_w
        weight = Buffer("weight", (wl.K, K))  # [K][C*R*S]: the layout of [K][C][R][S]
        out = Buffer("out", (wl.N, wl.K, pixels))
        stage = epilogue_stage(wl)
        if stage.residual is not None:  # indexed like the output, pixels flattened
            stage = dataclasses.replace(stage, residual=Buffer("residual", out.shape))
        if pointwise(wl):
            data = Buffer("data", (wl.C, pixels))
            right = Operand(N, "mn", vector_width(N), lambda _b, p, c: data[c, p])
        else:
            data = Buffer("data", (wl.N, wl.C, wl.H, wl.W))
            right = Operand(N, "mn", 1, lambda _b, p, crs: im2col(wl, data, p, crs))

        def pixel(p: Expr) -> tuple[Expr, Expr]:
            return (Const(0), p) if wl.N == 1 else (p // pixels, p % pixels)

        def finish(value: Expr, _b: Expr, m: Expr, p: Expr) -> Expr:
            n, q = pixel(p)
            return stage.apply(value, m, (n, m, q))

        def target(_b: Expr, m: Expr, p: Expr) -> Load:
            n, q = pixel(p)
            return out[n, m, q]

        problem = GemmProblem(
            1, M, N, K,
            a=Operand(M, "k", vector_width(K), lambda _b, m, k: weight[m, k]),
            b=right, out=target, finish=finish,
        )
        body = gemm_nest(GemmTiles.of(config), problem)
        return Kernel("conv2d_cuda", (data, weight, *stage.buffers, out), (), (body,))


def im2col(wl: _Window, data: Buffer, p: Expr, crs: Expr, channel0: ExprLike = 0,
           convert: Callable[[Expr], Expr] = lambda value: value,
           padding: Expr = ZERO) -> Expr:
    """Activation feeding output pixel ``p`` through reduction index ``crs``, passed through
    ``convert``, and ``padding`` in the padding; ``channel0`` is the first input channel the
    reduction covers (a group's first)."""
    pixels = wl.out_h * wl.out_w
    n, q = (Const(0), p) if wl.N == 1 else (p // pixels, p % pixels)
    oh, ow = q // wl.out_w, q % wl.out_w
    c, rs = crs // (wl.R * wl.S) + channel0, crs % (wl.R * wl.S)
    r, s = rs // wl.S, rs % wl.S
    top, left = wl.pad[0], wl.pad[1]
    h = oh * wl.stride[0] + r * wl.dilation[0] - top
    w = ow * wl.stride[1] + s * wl.dilation[1] - left
    if not any(wl.pad):
        return convert(data[n, c, h, w])
    inside = binop("and", binop("and", h >= 0, h < wl.H), binop("and", w >= 0, w < wl.W))
    clamped_h = binop("min", binop("max", h, 0), wl.H - 1)
    clamped_w = binop("min", binop("max", w, 0), wl.W - 1)
    return Select(inside, convert(data[n, c, clamped_h, clamped_w]), padding)
