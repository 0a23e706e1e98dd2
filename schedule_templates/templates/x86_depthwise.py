"""x86 template for ``depthwise_conv2d`` (NCHW), vectorized along output rows.

Each output channel reads one input channel, so there is no reduction over channels to
vectorize; instead a register tile is ``oh_t`` output rows by ``ow_v`` columns, vectorized along
the width. Kernel taps are unrolled: each tap is one vector load of the input row (unit stride,
or for stride 2..4 a wider load and a shuffle, which the zero-bordered copy's slack makes safe)
times a broadcast weight. A fused epilogue is applied to the row tile as it is stored.

Padding (and the slack strided loads need) comes from a zero-bordered copy. When a thread
owns whole channels (``parallel_rows`` off) and a plane is small, the copy is per channel into
the thread's own stack buffer right before that channel is computed, so it is read back from
L1/L2 instead of from a model-sized workspace written by a separate pass (version 2: the
stride-2 layers of MobileNet ran at ~10 GFLOPS with the whole-tensor copy).
"""

from __future__ import annotations

from collections.abc import Mapping

from schedule_templates.ir.nodes import (
    Allocate,
    Buffer,
    Const,
    Expr,
    Kernel,
    Load,
    LoopKind,
    Scope,
    Stmt,
    loop,
    store,
)
from schedule_templates.space import AnnotateKnob, ChoiceKnob, Config, ConfigSpace, SplitKnob
from schedule_templates.templates.base import Template, as_workload, register
from schedule_templates.templates.choose import ACC_REGISTERS, largest_divisor, vregs
from schedule_templates.templates.epilogue import epilogue_stage
from schedule_templates.templates.window import SLACK, needs_copy, pad_stage, padded_buffer
from schedule_templates.workloads import DepthwiseConv2d, Workload

MAX_OWV = 64
#: largest zero-bordered plane (floats, slack included) copied into a thread's stack buffer
MAX_LOCAL_PLANE = 64 * 1024


def _fits(cfg: Config) -> bool:
    oht, owv = cfg["tile_oh"][1], cfg["tile_ow"][1]
    return owv <= MAX_OWV and oht * vregs(owv) <= ACC_REGISTERS // 2


@register
class DepthwiseConv2dX86(Template):
    name = "depthwise_conv2d.x86"
    op = "depthwise_conv2d"
    target_kind = "llvm"
    version = 2
    fuses_epilogue = True

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = as_workload(workload, DepthwiseConv2d)
        knobs = (
            SplitKnob("tile_oh", wl.out_h, 2),
            SplitKnob("tile_ow", wl.out_w, 2),
            ChoiceKnob("parallel_rows", (False, True)),
            AnnotateKnob("unroll_r", ("none", "unroll")),
        )
        return ConfigSpace(knobs, constraint=_fits)

    def default_config(self, workload: Workload) -> Config:
        wl = as_workload(workload, DepthwiseConv2d)
        owv = largest_divisor(wl.out_w, MAX_OWV, prefer=(56, 32, 28, 16, 14))
        # two rows for 5x5 and larger windows: their unrolled taps load 2.5x more per row
        # (MobileNet-v3/EfficientNet 5x5 layers: 5-20% faster than four rows, one core)
        oht = largest_divisor(wl.out_h, max(1, (ACC_REGISTERS // 2) // vregs(owv)),
                              prefer=(2, 4) if wl.R * wl.S >= 25 else (4, 2))
        return self.space(wl).from_entities({
            "tile_oh": (wl.out_h // oht, oht),
            "tile_ow": (wl.out_w // owv, owv),
            "parallel_rows": False,
            "unroll_r": "unroll",
        })

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = as_workload(workload, DepthwiseConv2d)
        oho, oht = config["tile_oh"]
        owo, owv = config["tile_ow"]
        channels = wl.C * wl.multiplier
        data = Buffer("data", (wl.N, wl.C, wl.H, wl.W))
        weight = Buffer("weight", (channels, 1, wl.R, wl.S))
        out = Buffer("out", (wl.N, channels, wl.out_h, wl.out_w))
        epilogue = epilogue_stage(wl)
        stages: list[Stmt] = []
        workspace: tuple[Buffer, ...] = ()
        copy = needs_copy(wl, strided_vectors=True)
        rows_parallel = bool(config["parallel_rows"])
        local = copy and not rows_parallel and _plane_elements(wl) <= MAX_LOCAL_PLANE
        plane = Buffer("plane", _plane_shape(wl), Scope.LOCAL, slack=SLACK)
        if copy and not local:
            pad = padded_buffer(wl)
            workspace = (pad,)
            stages.append(pad_stage(wl, data, pad))
        t, par = loop("t", wl.N * channels * (oho if rows_parallel else 1), LoopKind.PARALLEL)
        hb, rows = loop("oh_o", 1 if rows_parallel else oho)
        q = t // oho if rows_parallel else t  # image * channels + output channel
        h_block = t % oho + hb if rows_parallel else hb
        n, oc = q // channels, q % channels
        ic = oc // wl.multiplier

        def src(h: Expr, w: Expr) -> Load:
            if local:
                return plane[h, w]
            if copy:
                return pad[n * wl.C + ic, h, w]
            return data[n, ic, h, w]

        wb, cols = loop("ow_o", owo)
        a, unroll_a = loop("a", oht, LoopKind.UNROLL)
        v, vec = loop("v", owv, LoopKind.VECTORIZE)
        r, r_loop = loop("r", wl.R, LoopKind.UNROLL if config["unroll_r"] == "unroll"
                         else LoopKind.SERIAL)
        s, s_loop = loop("s", wl.S, LoopKind.UNROLL)
        oh, ow = h_block * oht + a, wb * owv + v
        sh, sw = wl.stride
        dh, dw = wl.dilation
        acc = Buffer("acc", (oht, owv), Scope.LOCAL)
        tile = Allocate(acc, (
            unroll_a(vec(store(acc[a, v], Const(0.0, "float32")))),
            r_loop(s_loop(unroll_a(vec(store(
                acc[a, v], src(oh * sh + r * dh, ow * sw + s * dw) * weight[oc, 0, r, s]
                + acc[a, v]))))),
            unroll_a(vec(store(out[n, oc, oh, ow],
                               epilogue.apply(acc[a, v], oc, (n, oc, oh, ow))))),
        ))
        body: Stmt = rows(cols(tile))
        if local:
            body = Allocate(plane, (*_copy_plane(wl, data, plane, n, ic), body))
        stages.append(par(body))
        params = (data, weight, *epilogue.buffers, out)
        return Kernel("depthwise_conv2d_x86", params, workspace, tuple(stages))


def _plane_shape(wl: DepthwiseConv2d) -> tuple[int, int]:
    top, left, bottom, right = wl.pad
    return wl.H + top + bottom, wl.W + left + right


def _plane_elements(wl: DepthwiseConv2d) -> int:
    rows, cols = _plane_shape(wl)
    return rows * cols + SLACK


def _copy_plane(wl: DepthwiseConv2d, data: Buffer, plane: Buffer, n: Expr, c: Expr
                ) -> list[Stmt]:
    """One input channel into the zero-bordered stack buffer: border zeros, interior copy."""
    top, left, bottom, right = wl.pad
    cols = _plane_shape(wl)[1]
    zero = Const(0.0, "float32")
    stmts: list[Stmt] = []
    for first, count in ((0, top), (top + wl.H, bottom)):
        if count:
            h, row_loop = loop("zh", count)
            w, vec = loop("zw", cols, LoopKind.VECTORIZE)
            stmts.append(row_loop(vec(store(plane[first + h, w], zero))))
    h, row_loop = loop("ch", wl.H)
    row: list[Stmt] = []
    for first, count in ((0, left), (left + wl.W, right)):
        if count:
            w, vec = loop("zc", count, LoopKind.VECTORIZE)
            row.append(vec(store(plane[top + h, first + w], zero)))
    w, vec = loop("cw", wl.W, LoopKind.VECTORIZE)
    row.append(vec(store(plane[top + h, left + w], data[n, c, h, w])))
    stmts.append(row_loop(row))
    return stmts
