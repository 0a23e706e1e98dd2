"""x86 template for ``depthwise_conv2d_nchwc``: one vector lane per channel.

In the blocked layout the ``b`` channels of a pixel are contiguous, and each output channel
reads only its own input channel, so a vector of ``b`` channels is computed lane by lane with
no shuffles: a register tile is ``oh_t x ow_t`` output pixels, each one vector accumulator; a
kernel tap is one contiguous vector load of an input pixel times one vector of weights (packed
once as ``[C/b][R][S][b]``, zeros in padded lanes). Rows need no divisor of their width and a
7x7 map is not vectorized along a 7-wide row. The epilogue is applied as the tile is stored.

Padding comes from a zero-bordered copy (``local_copy``): per channel block into the thread's
stack buffer when the plane is small (read back from L1/L2 right away), otherwise one band of
input rows at a time, the rows a group of row blocks (up to 8 output rows) reads, just before
they read them; without ``local_copy``, or when even one row block's band would not fit the
stack budget, a whole-tensor workspace. The whole-tensor copy doubled the traffic of
the large stride-2 layers: MobileNet-v2's 112 x 112 96-channel one took 0.51 ms against
onnxruntime's 0.16.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from schedule_templates.ir.nodes import (
    Allocate,
    Buffer,
    Const,
    Expr,
    IfThen,
    Kernel,
    Load,
    LoopKind,
    Scope,
    Stmt,
    binop,
    loop,
    store,
)
from schedule_templates.space import AnnotateKnob, ChoiceKnob, Config, ConfigSpace, SplitKnob
from schedule_templates.templates.base import Template, as_workload, register
from schedule_templates.templates.choose import largest_divisor
from schedule_templates.templates.epilogue import epilogue_arguments, epilogue_stage
from schedule_templates.templates.x86_nchwc_window import (
    SLACK,
    balanced_width,
    copy_blocked_plane,
    pad_blocked_stage,
    padded_blocked,
    row_tiles,
    tile_widths,
    vector_registers,
)
from schedule_templates.workloads import DepthwiseConv2dNCHWc, Workload

#: widest default register tile (pixels)
MAX_DEFAULT_PIXELS = 8
#: largest zero-bordered plane (floats, slack included) copied into a thread's stack buffer
MAX_LOCAL_PLANE = 64 * 1024
#: output rows one band of a larger plane serves (its row blocks, rounded to a divisor)
BAND_OUTPUT_ROWS = 8


def _accumulators(block: int) -> int:
    """Accumulator vectors a tile may hold: the registers less an input and a weight vector."""
    return vector_registers(block) - 2


def _fits(block: int) -> Callable[[Config], bool]:
    def fits(cfg: Config) -> bool:
        return cfg["tile_oh"][1] * cfg["ow_t"] <= _accumulators(block)

    return fits


@register
class DepthwiseConv2dNCHWcX86(Template):
    name = "depthwise_conv2d_nchwc.x86"
    op = "depthwise_conv2d_nchwc"
    target_kind = "llvm"
    #: 2: a plane too large for the stack is copied band by band (version 1 copied the tensor)
    version = 2
    fuses_epilogue = True

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = as_workload(workload, DepthwiseConv2dNCHWc)
        knobs = (
            SplitKnob("tile_oh", wl.out_h, 2),
            ChoiceKnob("ow_t", tile_widths(wl.out_w)),
            AnnotateKnob("unroll_r", ("none", "unroll")),
            ChoiceKnob("local_copy", (True, False)),
        )
        return ConfigSpace(knobs, constraint=_fits(wl.block))

    def default_config(self, workload: Workload) -> Config:
        wl = as_workload(workload, DepthwiseConv2dNCHWc)
        # at most 8 pixels: 56-wide rows of 14-pixel tiles ran at 24 GFLOPS, of 4-8 at 33
        # (AVX2, one core, CPU time on a loaded machine); a 7-wide row stays one tile
        pixels = min(_accumulators(wl.block), MAX_DEFAULT_PIXELS)
        # two rows of a narrow map share the loads of their overlapping taps
        owt = balanced_width(wl.out_w, pixels if wl.out_w > pixels // 2 else pixels // 2)
        oht = largest_divisor(wl.out_h, max(1, pixels // owt), prefer=(2, 1))
        return self.space(wl).from_entities({
            "tile_oh": (wl.out_h // oht, oht),
            "ow_t": owt,
            "unroll_r": "unroll",
            "local_copy": True,
        })

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = as_workload(workload, DepthwiseConv2dNCHWc)
        oho, oht = config["tile_oh"]
        b = wl.block
        data = Buffer("data", wl.input_shapes()["data"])
        weight = Buffer("weight_packed", (wl.blocks_in, wl.R, wl.S, b))
        out = Buffer("out", wl.output_shape())
        epilogue = epilogue_stage(wl)
        stages: list[Stmt] = []
        workspace: tuple[Buffer, ...] = ()
        top, left, bottom, right = wl.pad
        plane_shape = (1, wl.H + top + bottom, wl.W + left + right, b)
        local = (any(wl.pad) and bool(config["local_copy"])
                 and int(np.prod(plane_shape)) + SLACK <= MAX_LOCAL_PLANE)
        # a plane too large for the stack is copied a band of rows at a time, each band just
        # before the row blocks that read it (from L1/L2 rather than from a tensor-sized copy);
        # a band spans several row blocks so that rows shared by neighbours are copied less
        group = _band_group(wl, oho, oht) if any(wl.pad) and config["local_copy"] else 0
        banded = group > 0 and not local
        group = group if banded else 1
        groups = oho // group
        band_rows = _band_rows(wl, group * oht)
        plane = Buffer("plane", plane_shape, Scope.LOCAL, slack=SLACK)
        band = Buffer("band", (1, band_rows, wl.W + left + right, b), Scope.LOCAL, slack=SLACK)
        if any(wl.pad) and not (local or banded):
            pad = padded_blocked(wl)
            workspace = (pad,)
            stages.append(pad_blocked_stage(wl, data, pad))
        # a thread that copies a plane owns all its rows, one that copies a band its group of
        # row blocks; otherwise row blocks are shared out one by one
        shares = 1 if local else groups if banded else oho
        t, par = loop("t", wl.N * wl.blocks_in * shares, LoopKind.PARALLEL)
        hb, rows = loop("oh_o", oho if local else group)
        q = t // shares
        h_block = hb if local else (t % shares) * group + hb
        n, cb = q // wl.blocks_in, q % wl.blocks_in
        # the band's first row, in padded coordinates
        first_row = (t % shares) * (group * oht * wl.stride[0])

        def src(h: Expr, w: Expr, k: Expr) -> Load:
            if local:
                return plane[0, h, w, k]
            if banded:
                return band[0, h - first_row, w, k]
            if any(wl.pad):
                return pad[q, h, w, k]
            return data[n, cb, h, w, k]

        unroll_r = LoopKind.UNROLL if config["unroll_r"] == "unroll" else LoopKind.SERIAL

        def tile(width: int, first: Expr | int, name: str) -> Sequence[Stmt]:
            a, unroll_a = loop(f"{name}a", oht, LoopKind.UNROLL)
            p, unroll_p = loop(f"{name}p", width, LoopKind.UNROLL)
            k, vec_k = loop(f"{name}k", b, LoopKind.VECTORIZE)
            r, r_loop = loop(f"{name}r", wl.R, unroll_r)
            s, s_loop = loop(f"{name}s", wl.S, LoopKind.UNROLL)
            oh, ow = h_block * oht + a, first + p
            acc = Buffer(f"acc_{name}", (oht, width, b), Scope.LOCAL)

            def each(stmt: Stmt) -> Stmt:
                return unroll_a(unroll_p(vec_k(stmt)))

            tap = src(oh * wl.stride[0] + r * wl.dilation[0],
                      ow * wl.stride[1] + s * wl.dilation[1], k)
            return [Allocate(acc, (
                each(store(acc[a, p, k], Const(0.0, "float32"))),
                r_loop(s_loop(each(store(acc[a, p, k],
                                         tap * weight[cb, r, s, k] + acc[a, p, k])))),
                each(store(out[n, cb, oh, ow, k], epilogue.apply(
                    acc[a, p, k], cb * b + k, (n, cb, oh, ow, k)))),
            ))]

        body: Stmt = rows(row_tiles(wl.out_w, int(config["ow_t"]), tile))
        if local:
            body = Allocate(plane, (*copy_blocked_plane(wl, data, plane, Const(0), n, cb), body))
        elif banded:
            body = Allocate(band, (*copy_band(wl, data, band, n, cb, first_row - top), body))
        stages.append(par(body))
        params = (data, weight, *epilogue.buffers, out)
        return Kernel("depthwise_conv2d_nchwc_x86", params, workspace, tuple(stages))

    def pack(self, workload: Workload, config: Config, inputs: Mapping[str, np.ndarray]
             ) -> dict[str, np.ndarray]:
        wl = as_workload(workload, DepthwiseConv2dNCHWc)
        return {"data": inputs["data"],
                "weight_packed": pack_blocked_depthwise(inputs["weight"], wl.block),
                **epilogue_arguments(wl, inputs)}


def _band_rows(wl: DepthwiseConv2dNCHWc, out_rows: int) -> int:
    """Input rows that ``out_rows`` consecutive output rows read."""
    return (out_rows - 1) * wl.stride[0] + (wl.R - 1) * wl.dilation[0] + 1


def _band_group(wl: DepthwiseConv2dNCHWc, oho: int, oht: int) -> int:
    """Row blocks of ``oht`` rows one band serves (a divisor of ``oho``, up to
    ``BAND_OUTPUT_ROWS`` output rows, the band within the stack budget), 0 if not even one."""
    width = wl.W + wl.pad[1] + wl.pad[3]
    fits = [g for g in range(1, oho + 1) if oho % g == 0 and g * oht <= max(
        oht, BAND_OUTPUT_ROWS) and _band_rows(wl, g * oht) * width * wl.block + SLACK
        <= MAX_LOCAL_PLANE]
    return max(fits, default=0)


def copy_band(wl: DepthwiseConv2dNCHWc, data: Buffer, band: Buffer, n: Expr, cb: Expr,
              first: Expr) -> list[Stmt]:
    """Input rows ``first ..`` of channel block ``cb`` into ``band`` (``[1][rows][Wp][b]``):
    rows outside the input and the left and right borders zero."""
    _, left, _, right = wl.pad
    rows, wp = band.shape[1], band.shape[2]
    zero = Const(0.0, "float32")
    i, band_rows = loop("bi", rows)
    h = first + i

    def zero_row(name: str) -> Stmt:
        w, cols = loop(f"{name}w", wp)
        k, vec = loop(f"{name}k", wl.block, LoopKind.VECTORIZE)
        return cols(vec(store(band[0, i, w, k], zero)))

    copied: list[Stmt] = []
    for at, count, name in ((0, left, "bl"), (left + wl.W, right, "br")):
        if count:
            w, cols = loop(f"{name}w", count)
            k, vec = loop(f"{name}k", wl.block, LoopKind.VECTORIZE)
            copied.append(cols(vec(store(band[0, i, at + w, k], zero))))
    w, cols = loop("bcw", wl.W)
    k, vec = loop("bck", wl.block, LoopKind.VECTORIZE)
    copied.append(cols(vec(store(band[0, i, left + w, k], data[n, cb, h, w, k]))))
    return [band_rows((
        IfThen(h < 0, (zero_row("bt"),)),
        IfThen(h >= wl.H, (zero_row("bb"),)),
        IfThen(binop("and", h >= 0, h < wl.H), tuple(copied)),
    ))]


def pack_blocked_depthwise(weight: np.ndarray, block: int) -> np.ndarray:
    """``[C][1][R][S]`` -> ``[C/b][R][S][b]``, zero-padded to whole channel blocks."""
    w = np.asarray(weight, dtype=np.float32)[:, 0]
    c, r, s = w.shape
    cb = -(-c // block)
    padded = np.zeros((cb * block, r, s), dtype=np.float32)
    padded[:c] = w
    return np.ascontiguousarray(padded.reshape(cb, block, r, s).transpose(0, 2, 3, 1))
