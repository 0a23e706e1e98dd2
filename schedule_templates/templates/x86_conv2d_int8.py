"""x86 template for ``conv2d_int8``: a direct convolution on ``x86_dot_gemm``'s int8 nest.

For each image and group, one GEMM: rows are the group's output channels (their weights
broadcast, 4 bytes or two 16-bit values per word), columns are output pixels (activations
loaded 16 at a time), the reduction runs over taps and input channels. Before it, the group's
input is rewritten once into words of consecutive channels, padded with the activation zero
point (so that padded taps cancel in the compensation ``-zp * sum(w)``, as in ``dense_int8``)
and split into ``stride_h * stride_w`` phases (every ``stride``-th row and column): tap
``(r, s)`` then reads one phase at a fixed offset from the output pixel, so the 16 lanes of a
load are 16 consecutive words whatever the stride or dilation.

Columns are pixels of a phase-width row (``Wh`` per output row: the ``Wh - OW`` extra ones are
computed and dropped) rounded up to whole registers; the tiles go to a workspace and the real
pixels are copied into NCHW, unless nothing is dropped (then they are stored in place). The
per-word tap offsets are a constant input computed at pack time. Depthwise layers (one input
channel per group) have a kernel of their own (``x86_depthwise_int8``): on this nest three
quarters of each word would be padding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from schedule_templates.ir.nodes import (
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
from schedule_templates.space import Config, ConfigSpace
from schedule_templates.templates import x86_dot_gemm
from schedule_templates.templates.base import Template, register
from schedule_templates.templates.base import as_workload as _as
from schedule_templates.templates.x86_dense_int8 import (
    OUT_DTYPES,
    compensation,
    requantized,
)
from schedule_templates.templates.x86_depthwise_int8 import (
    depthwise_default,
    depthwise_kernel,
    depthwise_space,
    is_depthwise,
)
from schedule_templates.templates.x86_dot_gemm import (
    VNNI,
    DotInstruction,
    as_words,
    dot_default,
    dot_nest,
    dot_space,
    padded_k,
    padded_n,
    partial_buffer,
    typed,
)
from schedule_templates.templates.x86_int8_stages import copy_rows, vector_walk
from schedule_templates.workloads import Conv2dInt8, Workload


@dataclasses.dataclass(frozen=True)
class _Geometry:
    """Where everything lies: phases of the padded input, columns, reduction words."""

    wl: Conv2dInt8
    inst: DotInstruction

    @property
    def phases(self) -> int:
        return self.wl.stride[0] * self.wl.stride[1]

    @property
    def phase_h(self) -> int:
        top, _, bottom, _ = self.wl.pad
        return -(-(self.wl.H + top + bottom) // self.wl.stride[0])

    @property
    def phase_w(self) -> int:
        _, left, _, right = self.wl.pad
        return -(-(self.wl.W + left + right) // self.wl.stride[1])

    @property
    def columns(self) -> int:
        """Output pixels computed per group, phase-width rows, whole registers."""
        return padded_n(self.wl.out_h * self.phase_w)

    @property
    def in_place(self) -> bool:
        """Whether the columns are exactly the output pixels (no copy needed)."""
        wl = self.wl
        return self.phase_w == wl.out_w and self.columns == wl.out_h * wl.out_w

    @property
    def channel_words(self) -> int:
        """Words holding one pixel's channels of a group (padded to whole groups of 4)."""
        return padded_k(self.wl.group_in, self.inst) // self.inst.per_word

    @property
    def reduction(self) -> int:
        """Values reduced per output (taps x padded channels), a multiple of 4."""
        return self.wl.R * self.wl.S * padded_k(self.wl.group_in, VNNI)

    @property
    def words(self) -> int:
        return self.wl.R * self.wl.S * self.channel_words

    @property
    def plane(self) -> int:
        """Words of one phase plane of one channel word: the plane plus what the columns
        dropped at its end read past it."""
        wl = self.wl
        reach = ((wl.R - 1) * wl.dilation[0] // wl.stride[0]) * self.phase_w + (
            (wl.S - 1) * wl.dilation[1] // wl.stride[1])
        return max(self.phase_h * self.phase_w, self.columns + reach)

    def used_phases(self) -> list[int]:
        """The phases some tap reads: all of them, or (a strided 1x1 convolution) one."""
        wl = self.wl
        sh, sw = wl.stride
        used = sorted({(r * wl.dilation[0] % sh) * sw + s * wl.dilation[1] % sw
                       for r in range(wl.R) for s in range(wl.S)})
        return used if len(used) == 1 else list(range(self.phases))

    def tap_offsets(self) -> np.ndarray:
        """For reduction word ``(r*S + s) * channel_words + cw``: where its column 0 lies."""
        wl = self.wl
        sh, sw = wl.stride
        offsets = np.zeros(self.words, dtype=np.int64)
        for r in range(wl.R):
            for s in range(wl.S):
                dy, dx = r * wl.dilation[0], s * wl.dilation[1]
                phase = (dy % sh) * sw + dx % sw
                for cw in range(self.channel_words):
                    offsets[(r * wl.S + s) * self.channel_words + cw] = (
                        (phase * self.channel_words + cw) * self.plane
                        + (dy // sh) * self.phase_w + dx // sw)
        return offsets.astype(np.int32)


@register
class Conv2dInt8X86(Template):
    name = "conv2d_int8.x86"
    op = "conv2d_int8"
    target_kind = "llvm"
    version = 1

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = _as(workload, Conv2dInt8)
        geo = _Geometry(wl, VNNI)  # the space is the same whatever the instruction
        if is_depthwise(wl):
            return depthwise_space(geo.columns)
        return dot_space(wl.group_out, geo.columns, geo.reduction, VNNI)

    def default_config(self, workload: Workload) -> Config:
        wl = _as(workload, Conv2dInt8)
        geo = _Geometry(wl, VNNI)
        if is_depthwise(wl):
            return depthwise_default(self.space(wl), geo.columns)
        return dot_default(self.space(wl), wl.group_out, geo.columns, geo.reduction,
                           x86_dot_gemm.int8_instruction())

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = _as(workload, Conv2dInt8)
        geo = _Geometry(wl, x86_dot_gemm.int8_instruction())
        if is_depthwise(wl):
            layout = (geo.phase_h, geo.phase_w, geo.columns, geo.plane)
            return depthwise_kernel(wl, config, layout)
        inst, nr = geo.inst, config["tile_n"][2]
        kg = wl.group_out
        data = Buffer("data", (wl.N, wl.C, wl.H, wl.W), dtype="uint8")
        weight = Buffer("weight_packed", (wl.groups, kg, geo.words), dtype="int32")
        taps = Buffer("tap_offsets", (geo.words,), dtype="int32")
        data_zp = Buffer("data_zero_point", (1,), dtype="int32")
        comp = Buffer("compensation", (wl.K,), dtype="int32")
        scale = Buffer("scale", (wl.K,) if wl.scale == "channel" else (1,))
        out_zp = Buffer("out_zero_point", (1,), dtype="int32")
        out = Buffer("out", wl.output_shape(), dtype=OUT_DTYPES[wl.out])
        phased = Buffer("phased", (geo.phases * geo.channel_words * geo.plane,),
                        Scope.WORKSPACE, "int32")
        tiles = Buffer("tiles", (kg, geo.columns), Scope.WORKSPACE, out.dtype)
        partial = partial_buffer(config, kg, geo.columns, inst)

        ng, images_loop = loop("ng", wl.N * wl.groups)
        n, g = ng // wl.groups, ng % wl.groups
        prepare = _phase_stage(wl, geo, data, data_zp, phased, n, g)

        def finish(acc: Expr, m: Expr, q: Expr) -> Stmt:
            k = g * kg + m
            value = requantized(acc + comp[k], scale[k if wl.scale == "channel" else 0],
                                out_zp[0], wl.out)
            return store(out[n, k, 0, q] if geo.in_place else tiles[m, q], value)

        nest = dot_nest(config, inst, a=lambda m, w: weight[g, m, w],
                        b=lambda p, w, j: phased[cast("int64", taps[w]) + p * nr + j],
                        finish=finish,
                        partial=partial, swap=True)
        body: list[Stmt] = [prepare, nest]
        if not geo.in_place:
            oh_count, ow_stride = wl.out_h, geo.phase_w
            body.append(copy_rows(
                lambda row, ow: tiles[row // oh_count, (row % oh_count) * ow_stride + ow],
                lambda row, ow: out[n, g * kg + row // oh_count, row % oh_count, ow],
                kg * wl.out_h, wl.out_w))
        workspaces = (phased, *(() if geo.in_place else (tiles,)),
                      *(() if partial is None else (partial,)))
        params = (data, weight, taps, data_zp, comp, scale,
                  *(() if wl.out == "f32" else (out_zp,)), out)
        return Kernel("conv2d_int8_x86", params, workspaces, (images_loop(*body),))

    def pack(self, workload: Workload, config: Config, inputs: Mapping[str, np.ndarray]
             ) -> dict[str, np.ndarray]:
        wl = _as(workload, Conv2dInt8)
        geo = _Geometry(wl, x86_dot_gemm.int8_instruction())
        weight = typed(inputs, "weight", np.int8)
        data_zp = typed(inputs, "data_zero_point", np.uint8).astype(np.int32).reshape(1)
        scale = np.asarray(inputs["scale"], dtype=np.float32).reshape(-1)
        args = {
            "data": typed(inputs, "data", np.uint8),
            **({"weight_taps": weight.reshape(wl.K, -1).astype(np.int32)} if is_depthwise(wl)
               else {"weight_packed": _pack_weights(wl, geo, weight),
                     "tap_offsets": geo.tap_offsets()}),
            "data_zero_point": data_zp,
            "compensation": compensation(wl.bias, inputs, weight, int(data_zp[0])),
            "scale": scale,
        }
        if wl.out != "f32":
            zp_type = np.uint8 if wl.out == "u8" else np.int8
            args["out_zero_point"] = typed(inputs, "out_zero_point", zp_type).astype(np.int32)
        return args


def _phase_stage(wl: Conv2dInt8, geo: _Geometry, data: Buffer, data_zp: Buffer,
                 phased: Buffer, n: Expr, g: Expr) -> Stmt:
    """Image n, group g -> ``phased[phase][channel word][y * Wh + x]``: the padded input's
    ``(y * sh + ph, x * sw + pw)``, the zero point where that is padding.

    Threaded over (channel word, phase, row) and vectorized along the row: each lane reads
    the ``per_word`` channels of one pixel from their planes (contiguous along the row for
    stride 1) and stores one word. Walking a pixel's channel words innermost instead read
    bytes a plane apart and ran at about 2 GB/s (0.38 ms of a 0.56 ms 1x1 convolution over
    256 channels at 56x56)."""
    sh, sw = wl.stride
    top, left, _, _ = wl.pad
    per, bits = geo.inst.per_word, 32 // geo.inst.per_word
    # only the phases some tap reads (a strided 1x1 convolution reads one of four)
    used = geo.used_phases()
    rows = len(used) * geo.phase_h
    i, rows_loop = loop("ph_i", geo.channel_words * rows, LoopKind.PARALLEL)
    cw, rest = i // rows, i % rows
    y = rest % geo.phase_h
    phase: Expr = (rest // geo.phase_h if len(used) == geo.phases else Const(used[0]))
    iy = y * sh + phase // sw - top
    row_inside = binop("and", iy >= 0, iy < wl.H)
    cy = binop("min", binop("max", iy, 0), wl.H - 1)
    # columns whose pixel is inside the image in every phase: read without clamps or selects,
    # so the 16 lanes are one contiguous load for stride 1 (a clamped index made LLVM gather)
    x_lo = min(geo.phase_w, -(-left // sw))
    x_hi = max(x_lo, min(geo.phase_w, (wl.W - sw + left) // sw + 1))
    rows_padded = any((top, wl.pad[2])) or geo.phase_h * sh > wl.H

    def byte(c: Expr, x: Expr, border: bool) -> Expr:
        ix = x * sw + phase % sw - left
        column = binop("min", binop("max", ix, 0), wl.W - 1) if border else ix
        value: Expr = cast("int32", data[n, g * wl.group_in + binop("min", c, wl.group_in - 1),
                                          cy, column])
        inside = binop("and", ix >= 0, ix < wl.W) if border else None
        if rows_padded:
            inside = row_inside if inside is None else binop("and", row_inside, inside)
        if inside is not None:
            value = Select(inside, value, data_zp[0])
        if wl.group_in % per:  # the last word's channels past the group's are zero
            value = Select(c < wl.group_in, value, Const(0, "int32"))
        return value

    def element(border: bool) -> Callable[[Expr], Stmt]:
        def store_word(x: Expr) -> Stmt:
            word: Expr = byte(cw * per, x, border)
            for k in range(1, per):  # wrapping int32 arithmetic: the top byte may set the sign
                word = word + byte(cw * per + k, x, border) * Const(1 << (bits * k), "int32")
            target = phased[(phase * geo.channel_words + cw) * geo.plane
                            + y * geo.phase_w + x]
            return store(target, word)

        return store_word

    return rows_loop(*vector_walk(x_lo, element(True), "ph_l"),
                     *vector_walk(x_hi - x_lo, element(False), "ph", start=x_lo),
                     *vector_walk(geo.phase_w - x_hi, element(True), "ph_e", start=x_hi))


def _pack_weights(wl: Conv2dInt8, geo: _Geometry, weight: np.ndarray) -> np.ndarray:
    """s8 ``[K][C/groups][R][S]`` -> int32 words ``[groups][K/groups][taps x channel words]``
    in the reduction's order, channels zero-padded (bytes for VNNI, 16-bit values else)."""
    cg = padded_k(wl.group_in, VNNI)
    values = np.zeros((wl.K, wl.R, wl.S, cg), dtype=np.int8 if geo.inst is VNNI else np.int16)
    values[..., :wl.group_in] = weight.transpose(0, 2, 3, 1)
    words = as_words(values).reshape(wl.groups, wl.group_out, geo.words)
    return np.ascontiguousarray(words)

