"""x86 template for ``conv2d`` (NCHW in, NCHW out), vectorized over output channels.

A register tile is ``oh_t x ow_t`` output pixels by ``k_t`` output channels, held as vector
accumulators along the channels. Each reduction step (one input channel and kernel tap)
broadcasts one activation per pixel and loads ``k_t`` contiguous weights from the weights packed
once as ``[K/k_t][C][R][S][k_t]``. Padding, when present, is a copy into a zero-bordered
workspace inside the timed region. Image, channel block and row block are fused into one
parallel loop. A fused epilogue (bias, scale, residual, clip) is applied to the register tile
as it is stored. The reduction hints the next channel block's weights into L2, a row of taps
per input channel and row (``weight_hints``): inside a model they come from memory (ResNet-50's
7x7 512-channel layer, weights flushed: 2.22 -> 1.94 ms on Emerald Rapids).

Output rows and columns are split as ``padded_spatial`` of their extent: an extent without a
divisor in 4..8 (SqueezeNet's 55, 27, 13) is tiled as the next one with such a divisor, the
last tile shifted back to end at the output's edge (``_tile_origin``).

For a 3x3 stride-1 window the ``algorithm`` knob adds Winograd F(2x2) and F(4x4) lowerings
(``x86_winograd``) that read the same knobs; the default config uses one where it wins
(``default_winograd``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from schedule_templates.ir.nodes import (
    Allocate,
    Buffer,
    Const,
    Expr,
    Kernel,
    LoopKind,
    Scope,
    Stmt,
    binop,
    loop,
    store,
)
from schedule_templates.space import AnnotateKnob, ChoiceKnob, Config, ConfigSpace, SplitKnob
from schedule_templates.templates.base import Template, as_workload, register
from schedule_templates.templates.choose import (
    ACC_REGISTERS,
    LANES,
    host_registers,
    largest_divisor,
    padded_spatial,
    vregs,
)
from schedule_templates.templates.epilogue import epilogue_arguments, epilogue_stage
from schedule_templates.templates.weight_hints import row_hints
from schedule_templates.templates.window import needs_copy, pad_stage, padded_buffer
from schedule_templates.templates.x86_winograd import (
    ALGORITHMS,
    default_winograd,
    eligible,
    lower_winograd,
    pack_winograd,
)
from schedule_templates.workloads import Conv2d, Workload

MAX_KT = 64
#: pixels of the default register tile for a window strided along the width
STRIDED_PIXELS = 8


def _fits(out_h: int, out_w: int) -> Callable[[Config], bool]:
    def fits(cfg: Config) -> bool:
        kt, oht, owt = cfg["tile_k"][1], cfg["tile_oh"][1], cfg["tile_ow"][1]
        ok = kt <= MAX_KT and oht * owt * vregs(kt) <= ACC_REGISTERS
        # a tile wider than the output has no place to shift back to (see _tile_origin)
        ok = ok and oht <= out_h and owt <= out_w
        # Winograd has no kernel-column loop: one setting of unroll_s, not two equal kernels
        return ok and (cfg["algorithm"] == "direct" or cfg["unroll_s"] == "unroll")
    return fits


@register
class Conv2dX86(Template):
    name = "conv2d.x86"
    op = "conv2d"
    target_kind = "llvm"
    version = 1
    fuses_epilogue = True

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = as_workload(workload, Conv2d)
        knobs = (
            SplitKnob("tile_k", wl.K, 2),
            SplitKnob("tile_oh", padded_spatial(wl.out_h), 2),
            SplitKnob("tile_ow", padded_spatial(wl.out_w), 2),
            ChoiceKnob("outer_order", ("k_h", "h_k")),
            ChoiceKnob("reduce_order", ("c_rs", "rs_c")),
            AnnotateKnob("unroll_s", ("none", "unroll")),
            ChoiceKnob("algorithm", ("direct", *ALGORITHMS) if eligible(wl) else ("direct",),
                       appended=True),
        )
        return ConfigSpace(knobs, constraint=_fits(wl.out_h, wl.out_w))

    def default_config(self, workload: Workload) -> Config:
        wl = as_workload(workload, Conv2d)
        out_h, out_w = padded_spatial(wl.out_h), padded_spatial(wl.out_w)
        winograd = default_winograd(wl, host_registers())
        if winograd is not None:
            algorithm, kt, rows = winograd
            return self.space(wl).from_entities({
                "tile_k": (wl.K // kt, kt),
                "tile_oh": (out_h, 1),
                "tile_ow": (out_w // rows, rows),
                "outer_order": "k_h",
                "reduce_order": "c_rs",
                "unroll_s": "unroll",
                "algorithm": algorithm,
            })
        # a tile of the host's register file: 14 x 32 channels with AVX-512, 7 x 16 with AVX2
        registers = host_registers()
        wide = registers.lanes >= LANES
        kt = largest_divisor(wl.K, MAX_KT, prefer=(32, 16, 48, 64) if wide else (16, 8, 32, 24))
        pixels = registers.accumulators // registers.vregs(kt)
        if wl.stride[1] > 1:
            # strided windows: about 8 pixels, 4 to 8 wide (1.3-3x the 14-pixel rows on
            # ResNet-18's and MobileNet-v2's stride-2 layers, one core)
            pixels = min(pixels, STRIDED_PIXELS)
            owt = largest_divisor(out_w, min(pixels, wl.out_w), prefer=(8, 4, 7))
        else:
            owt = largest_divisor(out_w, min(pixels, wl.out_w), prefer=(14, 8, 7))
        oht = largest_divisor(out_h, max(1, min(pixels // owt, wl.out_h)))
        # rows outermost when a layer narrows its channels and its input outweighs its weights:
        # each input row is then read once, the weights stay cached (ResNet-50's 256->64 and
        # 512->128 1x1 convs: ~12% faster; 64->256 and 1024->256 at 14x14: ~2-18% slower)
        narrowing = wl.C > wl.K and wl.H * wl.W > wl.K * wl.R * wl.S
        return self.space(wl).from_entities({
            "tile_k": (wl.K // kt, kt),
            "tile_oh": (out_h // oht, oht),
            "tile_ow": (out_w // owt, owt),
            "outer_order": "h_k" if narrowing else "k_h",
            "reduce_order": "c_rs",
            "unroll_s": "unroll",
        })

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = as_workload(workload, Conv2d)
        if config["algorithm"] != "direct":
            return lower_winograd(wl, config, ALGORITHMS[str(config["algorithm"])])
        ko, kt = config["tile_k"]
        oho, oht = config["tile_oh"]
        owo, owt = config["tile_ow"]
        data = Buffer("data", (wl.N, wl.C, wl.H, wl.W))
        packed = Buffer("weight_packed", (ko, wl.C, wl.R, wl.S, kt))
        out = Buffer("out", (wl.N, wl.K, wl.out_h, wl.out_w))
        epilogue = epilogue_stage(wl)
        stages: list[Stmt] = []
        workspace: tuple[Buffer, ...] = ()
        if needs_copy(wl):
            pad = padded_buffer(wl)
            workspace = (pad,)
            stages.append(pad_stage(wl, data, pad))

            def src(n, c, h, w):  # type: ignore[no-untyped-def]
                return pad[n * wl.C + c, h, w]
        else:
            def src(n, c, h, w):  # type: ignore[no-untyped-def]
                return data[n, c, h, w]

        t, par = loop("t", wl.N * ko * oho, LoopKind.PARALLEL)
        n = t // (ko * oho)
        rest = t % (ko * oho)
        kb, hb = (rest // oho, rest % oho) if config["outer_order"] == "k_h" else (
            rest % ko, rest // ko)
        wb, cols = loop("ow_o", owo)
        a, unroll_a = loop("a", oht, LoopKind.UNROLL)
        b, unroll_b = loop("b", owt, LoopKind.UNROLL)
        k, vec_k = loop("k", kt, LoopKind.VECTORIZE)
        c, c_loop = loop("c", wl.C)
        r, r_loop = loop("r", wl.R)
        s, s_loop = loop("s", wl.S, LoopKind.UNROLL if config["unroll_s"] == "unroll"
                         else LoopKind.SERIAL)
        oh = _tile_origin(hb, oht, oho, wl.out_h) + a
        ow = _tile_origin(wb, owt, owo, wl.out_w) + b
        sh, sw = wl.stride
        dh, dw = wl.dilation
        acc = Buffer("acc", (oht, owt, kt), Scope.LOCAL)
        update = unroll_a(unroll_b(vec_k(store(
            acc[a, b, k],
            src(n, c, oh * sh + r * dh, ow * sw + s * dw) * packed[kb, c, r, s, k] + acc[a, b, k],
        ))))
        # the next channel group's weights, the group's tiles taking turns: once per (c, r) the
        # row of S taps when the taps are innermost, else once per step
        turn = hb * owo + wb if config["outer_order"] == "k_h" else None
        if config["reduce_order"] == "c_rs":
            hints = row_hints(lambda x: packed[kb + 1, c, r, 0, x], wl.S * kt, turn, oho * owo)
            reduce = c_loop(r_loop(*hints, s_loop(update)))
        else:
            hints = row_hints(lambda x: packed[kb + 1, c, r, s, x], kt, turn, oho * owo)
            reduce = r_loop(s_loop(c_loop(*hints, update)))
        tile = Allocate(acc, (
            unroll_a(unroll_b(vec_k(store(acc[a, b, k], Const(0.0, "float32"))))),
            reduce,
            unroll_a(unroll_b(vec_k(store(
                out[n, kb * kt + k, oh, ow],
                epilogue.apply(acc[a, b, k], kb * kt + k, (n, kb * kt + k, oh, ow)),
            )))),
        ))
        stages.append(par(cols(tile)))
        params = (data, packed, *epilogue.buffers, out)
        return Kernel("conv2d_x86", params, workspace, tuple(stages))

    def pack(self, workload: Workload, config: Config, inputs: Mapping[str, np.ndarray]
             ) -> dict[str, np.ndarray]:
        wl = as_workload(workload, Conv2d)
        if config["algorithm"] != "direct":
            return pack_winograd(wl, config, ALGORITHMS[str(config["algorithm"])], inputs)
        ko, kt = config["tile_k"]
        weight = np.asarray(inputs["weight"], dtype=np.float32)
        packed = weight.reshape(ko, kt, wl.C, wl.R, wl.S).transpose(0, 2, 3, 4, 1)
        return {"data": inputs["data"], "weight_packed": np.ascontiguousarray(packed),
                **epilogue_arguments(wl, inputs)}


def _tile_origin(block: Expr, tile: int, blocks: int, extent: int) -> Expr:
    """The first output row (or column) of register tile ``block``. Where the splits cover a
    padded extent, the last tile is shifted back to end at the output's edge: it recomputes a
    few outputs of its neighbour (and stores the same values again) instead of computing
    outputs that do not exist, so every read stays inside the input and the loads of a tile
    stay at constant offsets from one base (a clamped index per pixel cost a register each:
    7-pixel tiles ran at half speed)."""
    start = block * tile
    return start if blocks * tile == extent else binop("min", start, extent - tile)
