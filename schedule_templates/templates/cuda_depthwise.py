"""CUDA template for ``depthwise_conv2d`` (NCHW, groups = C, any channel multiplier).

A block computes a ``BOH x BOW`` output tile of one (image, output channel): it first copies
the input patch that tile reads (zeros in the padding) and the channel's ``R x S`` weights into
shared memory, then each of its ``TY x TX`` threads accumulates an ``RH x RW`` register tile.
A thread's outputs are interleaved with its neighbours' (row ``a * TY + ty``, column
``b * TX + tx``) so that the warp's global stores coalesce.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from schedule_templates.ir.nodes import (
    Allocate,
    Barrier,
    Buffer,
    Const,
    Expr,
    IfThen,
    Kernel,
    LoopKind,
    Scope,
    Select,
    Stmt,
    binop,
    loop,
    store,
)
from schedule_templates.space import AnnotateKnob, ChoiceKnob, Config, ConfigSpace
from schedule_templates.templates.base import Template, as_workload, register
from schedule_templates.templates.cuda_tiling import (
    MAX_GRID_YZ,
    REGISTER_OVERHEAD,
    DeviceLimits,
    ceil_div,
    tile_cap,
)
from schedule_templates.templates.epilogue import epilogue_stage
from schedule_templates.workloads import DepthwiseConv2d, Workload

THREADS = (1, 2, 4, 8, 16, 32)
REGS = (1, 2, 4)


def _tiles(cfg: Config) -> tuple[int, int, int, int]:
    return cfg["threads_h"], cfg["regs_h"], cfg["threads_w"], cfg["regs_w"]


def _patch(wl: DepthwiseConv2d, boh: int, bow: int) -> tuple[int, int]:
    """Rows and columns of input that a ``boh x bow`` output tile reads."""
    return ((boh - 1) * wl.stride[0] + (wl.R - 1) * wl.dilation[0] + 1,
            (bow - 1) * wl.stride[1] + (wl.S - 1) * wl.dilation[1] + 1)


@register
class DepthwiseConv2dCuda(Template):
    name = "depthwise_conv2d.cuda"
    op = "depthwise_conv2d"
    target_kind = "cuda"
    version = 1
    fuses_epilogue = True

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = as_workload(workload, DepthwiseConv2d)
        limits = DeviceLimits.from_device(device)
        knobs = (
            ChoiceKnob("threads_h", THREADS),
            ChoiceKnob("regs_h", REGS),
            ChoiceKnob("threads_w", THREADS),
            ChoiceKnob("regs_w", REGS),
            AnnotateKnob("unroll_rs", ("none", "unroll")),
        )

        def valid(cfg: Config) -> bool:
            ty, rh, tx, rw = _tiles(cfg)
            ph, pw = _patch(wl, ty * rh, tx * rw)
            shared = 4 * (ph * pw + wl.R * wl.S)
            return (ty * rh <= tile_cap(wl.out_h) and tx * rw <= tile_cap(wl.out_w)
                    and wl.N * wl.C * wl.multiplier <= MAX_GRID_YZ
                    and ceil_div(wl.out_h, ty * rh) <= MAX_GRID_YZ
                    and limits.fits(tx * ty, shared, rh * rw + 2 + REGISTER_OVERHEAD))

        return ConfigSpace(knobs, constraint=valid)

    def default_config(self, workload: Workload) -> Config:
        space = self.space(workload)
        for ty, tx in ((8, 32), (16, 16), (8, 16), (4, 32), (16, 8), (4, 16), (8, 8), (2, 32),
                       (4, 8), (8, 4), (2, 16), (1, 32), (32, 1), (16, 2)):
            for rh, rw in ((2, 1), (1, 1), (4, 1), (2, 2)):
                cfg = space.from_entities({"threads_h": ty, "regs_h": rh, "threads_w": tx,
                                           "regs_w": rw, "unroll_rs": "unroll"})
                if space.is_valid(cfg.index):
                    return cfg
        raise ValueError("no valid depthwise config")  # unreachable: 4x8 threads always fit

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = as_workload(workload, DepthwiseConv2d)
        ty_n, rh, tx_n, rw = _tiles(config)
        boh, bow = ty_n * rh, tx_n * rw
        ph, pw = _patch(wl, boh, bow)
        channels = wl.C * wl.multiplier
        data = Buffer("data", (wl.N, wl.C, wl.H, wl.W))
        weight = Buffer("weight", (channels, wl.R * wl.S))
        out = Buffer("out", (wl.N, channels, wl.out_h, wl.out_w))
        stage = epilogue_stage(wl)
        patch = Buffer("patch", (ph, pw), Scope.SHARED)
        taps = Buffer("taps", (wl.R * wl.S,), Scope.SHARED)

        bz, z_loop = loop("nc", wl.N * channels, LoopKind.BLOCK_Z)
        by, y_loop = loop("bh", ceil_div(wl.out_h, boh), LoopKind.BLOCK_Y)
        bx, x_loop = loop("bw", ceil_div(wl.out_w, bow), LoopKind.BLOCK_X)
        n, cm = bz // channels, bz % channels
        h0 = by * (boh * wl.stride[0]) - wl.pad[0]
        w0 = bx * (bow * wl.stride[1]) - wl.pad[1]

        def threads(body: Callable[[Expr, Expr], Stmt | list[Stmt]]) -> Stmt:
            ty, ty_loop = loop("ty", ty_n, LoopKind.THREAD_Y)
            tx, tx_loop = loop("tx", tx_n, LoopKind.THREAD_X)
            return ty_loop(tx_loop(body(ty, tx)))

        def load(ty: Expr, tx: Expr) -> list[Stmt]:
            tid = ty * tx_n + tx
            return [
                _cooperative(ph * pw, ty_n * tx_n, tid, "p", lambda e: store(
                    patch[e // pw, e % pw], _padded(wl, data, n, cm // wl.multiplier,
                                                    h0 + e // pw, w0 + e % pw))),
                _cooperative(wl.R * wl.S, ty_n * tx_n, tid, "w",
                             lambda e: store(taps[e], weight[cm, e])),
            ]

        def compute(ty: Expr, tx: Expr) -> Stmt:
            acc = Buffer("acc", (rh, rw), Scope.LOCAL)
            a, a_loop = loop("a", rh, LoopKind.UNROLL)
            b, b_loop = loop("b", rw, LoopKind.UNROLL)
            kind = LoopKind.UNROLL if config["unroll_rs"] == "unroll" else LoopKind.SERIAL
            r, r_loop = loop("r", wl.R, kind)
            s, s_loop = loop("s", wl.S, kind)
            row, col = a * ty_n + ty, b * tx_n + tx
            tap = patch[row * wl.stride[0] + r * wl.dilation[0],
                        col * wl.stride[1] + s * wl.dilation[1]]
            oh, ow = by * boh + row, bx * bow + col
            result = stage.apply(acc[a, b], cm, (n, cm, oh, ow))
            out_store: Stmt = store(out[n, cm, oh, ow], result)
            conds = [c for c, needed in ((oh < wl.out_h, wl.out_h % boh),
                                         (ow < wl.out_w, wl.out_w % bow)) if needed]
            if conds:
                cond = conds[0] if len(conds) == 1 else binop("and", conds[0], conds[1])
                out_store = IfThen(cond, (out_store,))
            return Allocate(acc, (
                a_loop(b_loop(store(acc[a, b], Const(0.0, "float32")))),
                r_loop(s_loop(a_loop(b_loop(store(acc[a, b],
                                                  tap * taps[r * wl.S + s] + acc[a, b]))))),
                a_loop(b_loop(out_store)),
            ))

        body = Allocate(patch, (Allocate(taps, (threads(load), Barrier(), threads(compute))),))
        return Kernel("depthwise_conv2d_cuda", (data, weight, *stage.buffers, out), (),
                      (z_loop(y_loop(x_loop(body))),))


def _cooperative(total: int, threads: int, tid: Expr, tag: str,
                 copy: Callable[[Expr], Stmt]) -> Stmt:
    """``copy(e)`` for e in 0..total, spread over the block's threads."""
    rounds = ceil_div(total, threads)
    step, step_loop = loop(f"{tag}_l", rounds,
                           LoopKind.UNROLL if rounds <= 8 else LoopKind.SERIAL)
    e = step * threads + tid
    body: Stmt = copy(e)
    if total % threads:
        body = IfThen(e < total, (body,))
    return step_loop(body)


def _padded(wl: DepthwiseConv2d, data: Buffer, n: Expr, c: Expr, h: Expr, w: Expr) -> Expr:
    """``data[n, c, h, w]``, zero outside the image (clamped address, never out of bounds)."""
    inside = binop("and", binop("and", h >= 0, h < wl.H), binop("and", w >= 0, w < wl.W))
    value = data[n, c, binop("min", binop("max", h, 0), wl.H - 1),
                 binop("min", binop("max", w, 0), wl.W - 1)]
    return Select(inside, value, Const(0.0, "float32"))
