"""x86 template for ``group_conv2d`` (NCHW in, NCHW out): a direct convolution per group.

Groups are independent convolutions of ``C/g`` input to ``K/g`` output channels, so the
parallel loop fuses image, group, channel block and row block. A register tile is ``k_t``
output channels of one group by ``oh_t x ow_t`` output pixels. The ``vector`` knob picks the
axis its accumulators are vectorized along:

- ``k`` (as ``conv2d.x86``): each reduction step broadcasts one activation per pixel and loads
  ``k_t`` contiguous weights. Good when a group has 16 or more output channels.
- ``w`` (as ``depthwise_conv2d.x86``): each step loads one vector of ``ow_t`` activations per
  row (a wide load and a shuffle for strides 2..4, on the zero-bordered copy) and broadcasts one
  weight per channel. Good for narrow groups (ResNeXt, RegNet) and 1-D convolutions.

A ``w`` tile's row is computed in ``vector_lanes(ow_t)`` lanes, whole native vectors (a 7- or
28-wide row was split into power-of-two pieces, 4 + 2 + 1 or 16 + 8 + 4: three FMAs per row
and channel where one or two do, ~2x slower); the extra lanes read past the row (the
zero-bordered copy's slack) and only ``ow_t`` are stored.

Both read the weights packed once as ``[g][K/g/k_t][C/g][R][S][k_t]``. Padding (and a strided
or widened vector row) is a copy into a zero-bordered workspace inside the timed region. A
fused epilogue is applied to the register tile as it is stored. Winograd does not apply: a
group's reduction is too short for its transforms to pay off.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from schedule_templates.ir.nodes import (
    Allocate,
    Buffer,
    Const,
    Expr,
    Kernel,
    Load,
    LoopFactory,
    LoopKind,
    Scope,
    Stmt,
    loop,
    store,
)
from schedule_templates.space import AnnotateKnob, ChoiceKnob, Config, ConfigSpace, SplitKnob
from schedule_templates.templates.base import Template, as_workload, register
from schedule_templates.templates.choose import ACC_REGISTERS, LANES, largest_divisor, vregs
from schedule_templates.templates.epilogue import EpilogueStage, epilogue_arguments, epilogue_stage
from schedule_templates.templates.window import needs_copy, pad_stage, padded_buffer
from schedule_templates.workloads import GroupConv2d, Workload

#: widest vector of a register tile row (four zmm registers)
MAX_VECTOR = 64


#: lanes of the narrowest whole vector a widened ``w`` row is rounded up to (one ymm)
ROW_LANES = 8


def vector_lanes(width: int) -> int:
    """Lanes a ``w`` tile computes for a row of ``width`` outputs: ``width`` itself when it is
    a power of two or a multiple of ``ROW_LANES``, else the next one of those."""
    if width & (width - 1) == 0 or width % ROW_LANES == 0:
        return width
    if width < ROW_LANES:
        return 1 << width.bit_length()
    return -(-width // ROW_LANES) * ROW_LANES


def _fits(cfg: Config) -> bool:
    kt, oht, owt = cfg["tile_k"][1], cfg["tile_oh"][1], cfg["tile_ow"][1]
    if cfg["vector"] == "k":
        return kt <= MAX_VECTOR and oht * owt * vregs(kt) <= ACC_REGISTERS
    return owt <= MAX_VECTOR and kt * oht * vregs(vector_lanes(owt)) <= ACC_REGISTERS


@register
class GroupConv2dX86(Template):
    name = "group_conv2d.x86"
    op = "group_conv2d"
    target_kind = "llvm"
    version = 1
    fuses_epilogue = True

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = as_workload(workload, GroupConv2d)
        knobs = (
            SplitKnob("tile_k", wl.group_out, 2),
            SplitKnob("tile_oh", wl.out_h, 2),
            SplitKnob("tile_ow", wl.out_w, 2),
            ChoiceKnob("vector", ("k", "w")),
            ChoiceKnob("reduce_order", ("c_rs", "rs_c")),
            AnnotateKnob("unroll_s", ("none", "unroll")),
        )
        return ConfigSpace(knobs, constraint=_fits)

    def default_config(self, workload: Workload) -> Config:
        wl = as_workload(workload, GroupConv2d)
        # whole vectors of a group's channels; half vectors still beat a strided row's
        # wide loads and shuffles (rough measurements of ResNeXt layers on one core)
        if wl.group_out % LANES == 0 or (wl.stride[1] > 1 and wl.group_out % (LANES // 2) == 0):
            kt = largest_divisor(wl.group_out, MAX_VECTOR, prefer=(32, 16, 48, 64))
            pixels = ACC_REGISTERS // vregs(kt)
            owt = largest_divisor(wl.out_w, pixels, prefer=(14, 8, 7))
            oht = largest_divisor(wl.out_h, max(1, pixels // owt))
            vector, order = "k", "rs_c"  # rs_c: ~1.5x c_rs on ResNeXt's 16-channel groups
        else:  # vectors along the output row, a few channels and rows per tile
            owt = largest_divisor(wl.out_w, MAX_VECTOR, prefer=(56, 32, 28, 16, 14))
            budget = 16 // vregs(vector_lanes(owt))
            kt = largest_divisor(wl.group_out, max(1, budget), prefer=(8, 4))
            oht = largest_divisor(wl.out_h, max(1, budget // kt), prefer=(4, 2))
            vector, order = "w", "c_rs"
        return self.space(wl).from_entities({
            "tile_k": (wl.group_out // kt, kt),
            "tile_oh": (wl.out_h // oht, oht),
            "tile_ow": (wl.out_w // owt, owt),
            "vector": vector,
            "reduce_order": order,
            "unroll_s": "unroll",
        })

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = as_workload(workload, GroupConv2d)
        ko, kt = config["tile_k"]
        oho, oht = config["tile_oh"]
        owo, owt = config["tile_ow"]
        data = Buffer("data", (wl.N, wl.C, wl.H, wl.W))
        packed = Buffer("weight_packed", (wl.groups * ko, wl.group_in, wl.R, wl.S, kt))
        out = Buffer("out", (wl.N, wl.K, wl.out_h, wl.out_w))
        by_width = config["vector"] == "w"
        widened = by_width and vector_lanes(owt) != owt
        stages, workspace, src = _activations(wl, data, by_width, widened)
        t, par = loop("t", wl.N * wl.groups * ko * oho, LoopKind.PARALLEL)
        n, rest = t // (wl.groups * ko * oho), t % (wl.groups * ko * oho)
        gk, hb = rest // oho, rest % oho  # gk = group * ko + channel block
        wb, cols = loop("ow_o", owo)
        origin = _Origin(n, gk // ko, gk, (gk % ko) * kt, hb * oht, wb * owt)
        stage = epilogue_stage(wl)
        stages.append(par(cols(_register_tile(wl, config, origin, src, packed, out, stage))))
        params = (data, packed, *stage.buffers, out)
        return Kernel("group_conv2d_x86", params, workspace, tuple(stages))

    def pack(self, workload: Workload, config: Config, inputs: Mapping[str, np.ndarray]
             ) -> dict[str, np.ndarray]:
        wl = as_workload(workload, GroupConv2d)
        ko, kt = config["tile_k"]
        weight = np.asarray(inputs["weight"], dtype=np.float32)
        packed = weight.reshape(wl.groups, ko, kt, wl.group_in, wl.R, wl.S)
        packed = packed.transpose(0, 1, 3, 4, 5, 2).reshape(
            wl.groups * ko, wl.group_in, wl.R, wl.S, kt)
        return {"data": inputs["data"], "weight_packed": np.ascontiguousarray(packed),
                **epilogue_arguments(wl, inputs)}


SourceFn = Callable[[Expr, Expr, Expr, Expr], Load]


def _activations(wl: GroupConv2d, data: Buffer, by_width: bool, widened: bool
                 ) -> tuple[list[Stmt], tuple[Buffer, ...], SourceFn]:
    """Stages before the convolution, its workspace, and how it reads ``data[n, c, h, w]``
    (from a zero-bordered copy when padded, or when width vectors need a strided load or read
    past the row: the copy has slack)."""
    if not widened and not needs_copy(wl, strided_vectors=by_width):
        return [], (), lambda n, c, h, w: data[n, c, h, w]
    pad = padded_buffer(wl)
    return [pad_stage(wl, data, pad)], (pad,), lambda n, c, h, w: pad[n * wl.C + c, h, w]


@dataclasses.dataclass(frozen=True)
class _Origin:
    """Where one register tile sits: image, group, packed weight block, and the first output
    channel (within the group), row and column it computes."""

    n: Expr
    group: Expr
    block: Expr
    k0: Expr
    row0: Expr
    col0: Expr


def _register_tile(wl: GroupConv2d, config: Config, at: _Origin, src: SourceFn,
                   packed: Buffer, out: Buffer, stage: EpilogueStage) -> Stmt:
    """Zero the accumulators, reduce over the group's channels and the window, store."""
    _, kt = config["tile_k"]
    _, oht = config["tile_oh"]
    _, owt = config["tile_ow"]
    by_width = config["vector"] == "w"
    lanes = vector_lanes(owt) if by_width else owt  # computed columns; owt of them stored
    k, k_loop = loop("k", kt, LoopKind.UNROLL if by_width else LoopKind.VECTORIZE)
    a, a_loop = loop("a", oht, LoopKind.UNROLL)
    b, b_loop = loop("b", lanes, LoopKind.VECTORIZE if by_width else LoopKind.UNROLL)
    bs, stored_loop = loop("b", owt, LoopKind.VECTORIZE if by_width else LoopKind.UNROLL)
    c, c_loop = loop("c", wl.group_in)
    r, r_loop = loop("r", wl.R)
    s, s_loop = loop("s", wl.S, LoopKind.UNROLL if config["unroll_s"] == "unroll"
                     else LoopKind.SERIAL)
    oh, ow = at.row0 + a, at.col0 + b
    channel = at.group * wl.group_out + at.k0 + k

    def tile(body: Stmt, columns: LoopFactory = b_loop) -> Stmt:
        """The register tile's loops, the vectorized one innermost."""
        return k_loop(a_loop(columns(body))) if by_width else a_loop(columns(k_loop(body)))

    # accumulators laid out with the vectorized axis contiguous
    acc = Buffer("acc", (kt, oht, lanes) if by_width else (oht, lanes, kt), Scope.LOCAL)
    cell = acc[k, a, b] if by_width else acc[a, b, k]
    pixel = src(at.n, at.group * wl.group_in + c, oh * wl.stride[0] + r * wl.dilation[0],
                ow * wl.stride[1] + s * wl.dilation[1])
    update = tile(store(cell, pixel * packed[at.block, c, r, s, k] + cell))
    reduce = (c_loop(r_loop(s_loop(update))) if config["reduce_order"] == "c_rs"
              else r_loop(s_loop(c_loop(update))))
    stored = acc[k, a, bs] if by_width else acc[a, bs, k]
    result = stage.apply(stored, channel, (at.n, channel, oh, at.col0 + bs))
    return Allocate(acc, (tile(store(cell, Const(0.0, "float32"))), reduce,
                          tile(store(out[at.n, channel, oh, at.col0 + bs], result),
                               stored_loop)))
