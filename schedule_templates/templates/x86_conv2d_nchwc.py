"""x86 template for ``conv2d_nchwc``: blocked activations in and out, direct convolution.

A register tile is ``oh_t x ow_t`` output pixels by ``kb_t`` output channel blocks, one vector
of ``b`` channels each. A reduction step (input channel block, kernel tap, one of its ``b``
channels) broadcasts one activation per pixel, read from the ``b`` contiguous channels of that
pixel, and loads ``kb_t`` weight vectors from the weights packed once as
``[K/b/kb_t][C/b][R][S][b][kb_t][b]`` (zeros for padded input or output channels). Stores are
whole vectors: ``b`` channels of one pixel are contiguous in the output. The epilogue (scale,
bias, residual, activation) is applied to the tile in the blocked layout.

Rows are cut into tiles of any width (``x86_nchwc_window.row_tiles``). Padding is a copy into a
zero-bordered blocked workspace; a layer with ``in_layout=nchw`` (an RGB stem) reads plain NCHW
planes instead, padded as the NCHW template pads them. Image, channel block group and row block
share one parallel loop, in the order ``outer_order`` says. Each reduction step hints the next
channel group's weights into L2 (``weight_hints``): inside a model they come from memory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

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
from schedule_templates.templates.choose import largest_divisor
from schedule_templates.templates.epilogue import EpilogueStage, epilogue_arguments, epilogue_stage
from schedule_templates.templates.weight_hints import row_hints
from schedule_templates.templates.window import pad_stage, padded_buffer
from schedule_templates.templates.x86_nchwc_window import (
    balanced_width,
    pad_blocked_stage,
    padded_blocked,
    row_tiles,
    tile_widths,
    vector_registers,
)
from schedule_templates.workloads import Conv2dNCHWc, Workload
from schedule_templates.workloads.conv_nchwc import BlockedWindow

#: most output channel blocks in one register tile
MAX_KBT = 4


def _accumulators(block: int, kbt: int) -> int:
    """Accumulator vectors a tile may hold: the registers less one broadcast and the weights,
    and never more than all but four (LLVM needs temporaries beside them)."""
    registers = vector_registers(block)
    return min(registers - 1 - kbt, registers - 4)


#: per-core L2 the default's loop order assumes: the smallest among the hosts measured (Zen 4
#: and Zen 5 have 1 MB, the Intel Xeons 2 MB)
L2_BYTES = 1 << 20


def _fits(block: int) -> Callable[[Config], bool]:
    def fits(cfg: Config) -> bool:
        kbt, oht, owt = cfg["tile_kb"][1], cfg["tile_oh"][1], cfg["ow_t"]
        return kbt <= MAX_KBT and oht * owt * kbt <= _accumulators(block, kbt)

    return fits


@register
class Conv2dNCHWcX86(Template):
    name = "conv2d_nchwc.x86"
    op = "conv2d_nchwc"
    target_kind = "llvm"
    version = 1
    fuses_epilogue = True

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = as_workload(workload, Conv2dNCHWc)
        knobs = (
            SplitKnob("tile_kb", wl.blocks_out, 2),
            SplitKnob("tile_oh", wl.out_h, 2),
            ChoiceKnob("ow_t", tile_widths(wl.out_w)),
            ChoiceKnob("outer_order", ("k_h", "h_k")),
            AnnotateKnob("unroll_s", ("none", "unroll")),
            AnnotateKnob("unroll_c", ("none", "unroll")),
        )
        return ConfigSpace(knobs, constraint=_fits(wl.block))

    def default_config(self, workload: Workload) -> Config:
        wl = as_workload(workload, Conv2dNCHWc)
        # three output blocks by 4 pixels, else two by 6: on MobileNet-v2's 1x1 convs (AVX2,
        # one core, CPU time on a loaded machine) 3x4 reached 72-78 GFLOPS, 2x6 66-70, one block
        # of 12 pixels 57-63; the channel loop rolled was 2-12% faster than unrolled
        kbt = largest_divisor(wl.blocks_out, 3, prefer=(3, 2))
        pixels = _accumulators(wl.block, kbt) // kbt
        owt = balanced_width(wl.out_w, pixels)
        oht = largest_divisor(wl.out_h, max(1, pixels // owt))
        # rows outermost when a layer narrows its channels and its input outweighs its weights
        # (the NCHW template's rule: each input row is then read once, the weights stay cached)
        narrowing = wl.C > wl.K and wl.H * wl.W > wl.K * wl.R * wl.S
        # and when the input outgrows L2 while the weights fit, so that every output channel
        # block's sweep would fetch the input from beyond L2 again: ResNet-50's 256 -> 512
        # 1x1 stride-2 shortcut ran 1.70 -> 1.33 ms (1 thread; 0.85 -> 0.67 at 2), 128- and
        # 96-channel 56x56 1x1 layers 4-9% faster; with 2 MB of weights the rows-outer order
        # was 10% slower, with 8 MB 1.8x (Intel Xeon, 2 MB L2)
        sweeps = wl.blocks_out // kbt > 1
        streaming = (sweeps and 4 * wl.C * wl.H * wl.W > L2_BYTES
                     and 4 * wl.C * wl.K * wl.R * wl.S <= L2_BYTES // 2)
        return self.space(wl).from_entities({
            "tile_kb": (wl.blocks_out // kbt, kbt),
            "tile_oh": (wl.out_h // oht, oht),
            "ow_t": owt,
            "outer_order": "h_k" if narrowing or streaming else "k_h",
            # a 5- or 7-wide window unrolled around the channel loop: ResNet-50's 7x7 RGB stem
            # ran 3.68 -> 2.11 ms rolled, a 5x5 one 1.10 -> 0.54; 64- and 48-channel 5x5 and
            # 7x7 layers the same either way (Zen 4, one core)
            "unroll_s": "unroll" if wl.S <= 3 else "none",
            "unroll_c": "none",
        })

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = as_workload(workload, Conv2dNCHWc)
        return blocked_conv_kernel(wl, config, "conv2d_nchwc_x86", wl.blocks_in)

    def pack(self, workload: Workload, config: Config, inputs: Mapping[str, np.ndarray]
             ) -> dict[str, np.ndarray]:
        wl = as_workload(workload, Conv2dNCHWc)
        kbt = config["tile_kb"][1]
        return {"data": inputs["data"],
                "weight_packed": pack_blocked_weight(inputs["weight"], wl.block, kbt),
                **epilogue_arguments(wl, inputs)}


def blocked_conv_kernel(wl: BlockedWindow, config: Config, kernel_name: str, span: int,
                        first_block: Callable[[Expr], Expr] | None = None) -> Kernel:
    """The direct blocked convolution: each tile of output blocks reduces over ``span`` input
    blocks, from ``first_block(tile)`` (a grouped layer's own groups) or from block 0."""
    ko, kbt = config["tile_kb"]
    oho, oht = config["tile_oh"]
    b = wl.block
    plain_in = bool(getattr(wl, "plain_in", False))
    data = Buffer("data", wl.input_shapes()["data"])
    packed = Buffer("weight_packed", (ko, span, wl.R, wl.S, b, kbt, b))
    out = Buffer("out", wl.output_shape())
    epilogue = epilogue_stage(wl)
    stages: list[Stmt] = []
    workspace: tuple[Buffer, ...] = ()
    if plain_in:  # one block at most: cb is 0; each tap reads one channel plane
        if any(wl.pad):
            plane = padded_buffer(wl)
            workspace = (plane,)
            stages.append(pad_stage(wl, data, plane))

            def src(n: Expr, cb: Expr, h: Expr, w: Expr, c: Expr) -> Load:
                return plane[n * wl.C + c, h, w]
        else:
            def src(n: Expr, cb: Expr, h: Expr, w: Expr, c: Expr) -> Load:
                return data[n, c, h, w]
    elif any(wl.pad):
        pad = padded_blocked(wl)
        workspace = (pad,)
        stages.append(pad_blocked_stage(wl, data, pad))

        def src(n: Expr, cb: Expr, h: Expr, w: Expr, c: Expr) -> Load:
            return pad[n * wl.blocks_in + cb, h, w, c]
    else:
        def src(n: Expr, cb: Expr, h: Expr, w: Expr, c: Expr) -> Load:
            return data[n, cb, h, w, c]

    t, par = loop("t", wl.N * ko * oho, LoopKind.PARALLEL)
    n = t // (ko * oho)
    rest = t % (ko * oho)
    kg, hb = (rest // oho, rest % oho) if config["outer_order"] == "k_h" else (
        rest % ko, rest // ko)
    kinds = {name: LoopKind.UNROLL if config[name] == "unroll" else LoopKind.SERIAL
             for name in ("unroll_s", "unroll_c")}

    def tile(width: int, first: Expr | int, name: str) -> Sequence[Stmt]:
        a, unroll_a = loop(f"{name}a", oht, LoopKind.UNROLL)
        p, unroll_p = loop(f"{name}p", width, LoopKind.UNROLL)
        j, unroll_j = loop(f"{name}j", kbt, LoopKind.UNROLL)
        k, vec_k = loop(f"{name}k", b, LoopKind.VECTORIZE)
        cb, cb_loop = loop(f"{name}cb", span)
        r, r_loop = loop(f"{name}r", wl.R)
        s, s_loop = loop(f"{name}s", wl.S, kinds["unroll_s"])
        # a layer with fewer input channels than a block (an RGB stem) reads only the real
        # ones: the rest of its single block is zero padding
        c, c_loop = loop(f"{name}c", min(b, wl.C), kinds["unroll_c"])
        oh, ow = hb * oht + a, first + p
        acc = Buffer(f"acc_{name}", (oht, width, kbt, b), Scope.LOCAL)

        def each(stmt: Stmt) -> Stmt:
            return unroll_a(unroll_p(unroll_j(vec_k(stmt))))

        block_in = cb if first_block is None else first_block(kg) + cb
        tap = src(n, block_in, oh * wl.stride[0] + r * wl.dilation[0],
                  ow * wl.stride[1] + s * wl.dilation[1], c)
        update = each(store(
            acc[a, p, j, k], tap * packed[kg, cb, r, s, c, j, k] + acc[a, p, j, k]))
        # the next channel group's weights, the group's row blocks taking turns
        hints = row_hints(lambda x: packed[kg + 1, cb, r, s, c, 0, x], kbt * b,
                          hb if config["outer_order"] == "k_h" else None, oho)
        kb = kg * kbt + j
        return [Allocate(acc, (
            each(store(acc[a, p, j, k], Const(0.0, "float32"))),
            cb_loop(r_loop(s_loop(c_loop(*hints, update)))),
            each(store(out[n, kb, oh, ow, k], _stored(epilogue, acc[a, p, j, k], b, kb,
                                                      (n, kb, oh, ow, k)))),
        ))]

    stages.append(par(row_tiles(wl.out_w, int(config["ow_t"]), tile)))
    params = (data, packed, *epilogue.buffers, out)
    return Kernel(kernel_name, params, workspace, tuple(stages))


def _stored(epilogue: EpilogueStage, value: Expr, block: int, kb: Expr,
            index: tuple[Expr, ...]) -> Expr:
    return epilogue.apply(value, kb * block + index[-1], index)


def pack_blocked_weight(weight: np.ndarray, block: int, kbt: int) -> np.ndarray:
    """``[K][C][R][S]`` -> ``[K/b/kbt][C/b][R][S][b (input)][kbt][b (output)]``, zero-padded
    to whole blocks of input and output channels."""
    w = np.asarray(weight, dtype=np.float32)
    k, c, r, s = w.shape
    kb, cb = -(-k // block), -(-c // block)
    padded = np.zeros((kb * block, cb * block, r, s), dtype=np.float32)
    padded[:k, :c] = w
    # (ko, kbt, bk, cb, bc, r, s) -> (ko, cb, r, s, bc, kbt, bk)
    split = padded.reshape(kb // kbt, kbt, block, cb, block, r, s)
    return np.ascontiguousarray(split.transpose(0, 3, 5, 6, 4, 1, 2))
