"""The depthwise case of ``conv2d_int8.x86`` (one input channel per group): int32 vectors.

With one input channel there is nothing to reduce across channels, so the dot-product
instructions would carry three quarters padding. Instead each output channel runs on its own:
its input channel is copied once into stride phases (as in ``x86_conv2d_int8``, padded with the
zero point) as int32, and every tap adds ``weight * input`` to ``nr`` output pixels held in
int32 vector accumulators (``vpmulld`` + ``vpaddd``: exact, since |u8 * s8| * taps is far
below 2**31). The taps are unrolled with constant offsets; the output channels are the
parallel loop. Requantization is ``dense_int8``'s; the real pixels are copied out as there.
"""

from __future__ import annotations

from schedule_templates.ir.nodes import (
    Allocate,
    Buffer,
    Const,
    Expr,
    Kernel,
    LoopKind,
    Scope,
    Select,
    Stmt,
    binop,
    cast,
    loop,
    store,
)
from schedule_templates.space import Config, ConfigSpace, SplitKnob
from schedule_templates.templates.choose import LANES
from schedule_templates.templates.requantize import OUT_DTYPES, requantized
from schedule_templates.templates.x86_int8_stages import copy_rows
from schedule_templates.workloads import Conv2dInt8

MAX_NR = 64

#: (phase rows, phase row width, output columns computed, words per phase plane)
Layout = tuple[int, int, int, int]


def is_depthwise(wl: Conv2dInt8) -> bool:
    return wl.group_in == 1 and wl.groups > 1


def depthwise_space(columns: int) -> ConfigSpace:
    """Output pixels per step: ``tile_n``'s inner factor, whole registers."""
    return ConfigSpace((SplitKnob("tile_n", columns, 2),), constraint=_fits)


def _fits(cfg: Config) -> bool:
    nr = cfg["tile_n"][1]
    return nr % LANES == 0 and nr <= MAX_NR


def depthwise_default(space: ConfigSpace, columns: int) -> Config:
    nr = max(w for w in (64, 48, 32, 16) if columns % w == 0)
    return space.from_entities({"tile_n": (columns // nr, nr)})


def depthwise_kernel(wl: Conv2dInt8, config: Config, layout: Layout) -> Kernel:
    """The kernel for ``layout``: (phase rows, phase row width, output columns computed, words
    per phase plane)."""
    _, phase_w, columns, plane = layout
    sh, sw = wl.stride
    phases = sh * sw
    nr = config["tile_n"][1]
    data = Buffer("data", (wl.N, wl.C, wl.H, wl.W), dtype="uint8")
    weight = Buffer("weight_taps", (wl.K, wl.R * wl.S), dtype="int32")
    data_zp = Buffer("data_zero_point", (1,), dtype="int32")
    comp = Buffer("compensation", (wl.K,), dtype="int32")
    scale = Buffer("scale", (wl.K,) if wl.scale == "channel" else (1,))
    out_zp = Buffer("out_zero_point", (1,), dtype="int32")
    out = Buffer("out", wl.output_shape(), dtype=OUT_DTYPES[wl.out])
    phased = Buffer("phased", (wl.C * phases * plane,), Scope.WORKSPACE, "int32")
    tiles = Buffer("tiles", (wl.K, columns), Scope.WORKSPACE, out.dtype)

    n, images = loop("dw_n", wl.N)
    prepare = _phase_stage(wl, layout, data, data_zp, phased, n)

    k, channels = loop("dw_k", wl.K, LoopKind.PARALLEL)
    block, blocks = loop("dw_b", columns // nr)
    j, lanes = loop("dw_j", nr, LoopKind.VECTORIZE)
    acc = Buffer("acc", (1, nr), Scope.LOCAL, "int32")
    c = k // (wl.K // wl.C)
    q0 = block * nr
    steps: list[Stmt] = [lanes(store(acc[0, j], Const(0, "int32")))]
    for r in range(wl.R):
        for s in range(wl.S):
            dy, dx = r * wl.dilation[0], s * wl.dilation[1]
            offset = ((dy % sh) * sw + dx % sw) * plane + (dy // sh) * phase_w + dx // sw
            value = phased[(c * phases) * plane + offset + q0 + j]
            steps.append(lanes(store(acc[0, j], acc[0, j] + value * weight[k, r * wl.S + s])))
    quantized = requantized(acc[0, j] + comp[k], scale[k if wl.scale == "channel" else 0],
                            out_zp[0], wl.out)
    steps.append(lanes(store(tiles[k, q0 + j], quantized)))
    tile = Allocate(acc, tuple(steps))
    compute = channels(blocks(tile))
    oh_count = wl.out_h
    copy = copy_rows(lambda rr, ow: tiles[rr // oh_count, (rr % oh_count) * phase_w + ow],
                     lambda rr, ow: out[n, rr // oh_count, rr % oh_count, ow],
                     wl.K * oh_count, wl.out_w, "dw_o")
    params = (data, weight, data_zp, comp, scale,
              *(() if wl.out == "f32" else (out_zp,)), out)
    return Kernel("conv2d_int8_dw_x86", params, (phased, tiles),
                  (images(prepare, compute, copy),))


def _phase_stage(wl: Conv2dInt8, layout: Layout, data: Buffer, data_zp: Buffer,
                 phased: Buffer, n: Expr) -> Stmt:
    """Image n -> ``phased[channel][phase][y * phase_w + x]`` as int32: the padded input's
    ``(y * sh + ph, x * sw + pw)``, the zero point where that is padding."""
    phase_h, phase_w, _, plane = layout
    sh, sw = wl.stride
    top, left, _, _ = wl.pad
    c, channels = loop("dw_c", wl.C, LoopKind.PARALLEL)
    stages: list[Stmt] = []
    for ph in range(sh):
        for pw in range(sw):
            y, ys = loop(f"dw_y{ph}_{pw}", phase_h)
            x, xs = loop(f"dw_x{ph}_{pw}", phase_w)
            iy, ix = y * sh + (ph - top), x * sw + (pw - left)
            inside = binop("and", binop("and", iy >= 0, iy < wl.H),
                           binop("and", ix >= 0, ix < wl.W))
            # clamped, so that the load stays in the buffer whichever value is selected
            cy = binop("min", binop("max", iy, 0), wl.H - 1)
            cx = binop("min", binop("max", ix, 0), wl.W - 1)
            value = Select(inside, cast("int32", data[n, c, cy, cx]), data_zp[0])
            base = (c * (sh * sw) + ph * sw + pw) * plane
            stages.append(ys(xs(store(phased[base + y * phase_w + x], value))))
    return channels(*stages)
