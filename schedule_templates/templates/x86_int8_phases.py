"""The input stage of ``conv2d_int8.x86`` and ``conv2d_bf16.x86``: where the phases of the
padded input lie, and the kernel stage that writes them.

Before the GEMM, a group's input is rewritten once into words of consecutive channels (4 bytes,
or two 16-bit values for ``vpmaddwd``), padded with the activation zero point and split into
``stride_h * stride_w`` phases (every ``stride``-th row and column), so that tap ``(r, s)``
reads one phase at a fixed offset from the output pixel and the 16 lanes of a load are 16
consecutive words whatever the stride or dilation (``x86_conv2d_int8``). The bf16 convolution
packs two channels' bfloat16 bits per word (rounded from fp32 here) and pads with 0.0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from schedule_templates.ir.nodes import (
    Buffer,
    Const,
    Expr,
    LoopKind,
    Scope,
    Select,
    Stmt,
    binop,
    cast,
    loop,
    store,
)
from schedule_templates.space import Config
from schedule_templates.templates import x86_amx_gemm
from schedule_templates.templates.x86_depthwise_int8 import is_depthwise
from schedule_templates.templates.x86_dot_gemm import (
    VNNI,
    DotInstruction,
    Finish,
    dot_nest,
    padded_k,
    padded_n,
)
from schedule_templates.templates.x86_int8_stages import copy_rows, vector_walk
from schedule_templates.workloads import Conv2dBf16, Conv2dInt8

#: the tile widths the columns are rounded for (the smallest rounding wins, ties to the first):
#: 56x56 maps then get 64-wide tiles, 28x28 ones 48, 14x14 ones 32; against whole registers
#: (16), ResNet-50's int8 layers ran 1.03-1.26x faster alone on Zen 5 although up to 8% more
#: columns are computed and 28x28 1x1 layers (784 pixels) lose their in-place store
WIDE_COLUMNS = (64, 48, 32)
#: columns of one AMX register block (2 tiles of 16)
TILE_BLOCK_COLS = 32


@dataclasses.dataclass(frozen=True)
class StridePhases:
    """The padded input split into ``stride_h * stride_w`` phases (every stride-th row and
    column): their count and extent, and which of them the taps read."""

    wl: Conv2dInt8 | Conv2dBf16

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

    def used_phases(self) -> list[int]:
        """The phases some tap reads: all of them, or (a strided 1x1 convolution) one."""
        wl = self.wl
        sh, sw = wl.stride
        used = sorted({(r * wl.dilation[0] % sh) * sw + s * wl.dilation[1] % sw
                       for r in range(wl.R) for s in range(wl.S)})
        return used if len(used) == 1 else list(range(self.phases))


@dataclasses.dataclass(frozen=True)
class Geometry(StridePhases):
    """Where everything lies: phases of the padded input, columns, reduction words."""

    inst: DotInstruction

    @property
    def columns(self) -> int:
        """Output pixels computed per group: phase-width rows rounded up to a whole number of
        32, 48 or 64 lanes, whichever computes the fewest, so that a register tile can be two
        to four registers wide (a tile one register wide runs load-bound: ResNet-50's 56x56
        3x3 layer, 3248 columns, at 0.31 ms as 8 x 16 against 0.24 ms as 8 x 48 on 3264, Zen 5;
        see ``WIDE_COLUMNS``). Depthwise layers keep whole registers (their kernel steps
        16 lanes at a time)."""
        pixels = self.wl.out_h * self.phase_w
        if isinstance(self.wl, Conv2dInt8) and is_depthwise(self.wl):
            return padded_n(pixels)
        return min(-(-pixels // width) * width for width in WIDE_COLUMNS)

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
        """Values reduced per output (taps x padded channels): a multiple of 4 for the int8
        instructions, whatever the host (their spaces are the same), of 2 for bf16."""
        inst = self.inst if self.inst.acc_dtype == "float32" else VNNI
        return self.wl.R * self.wl.S * padded_k(self.wl.group_in, inst)

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

    # what the GEMM sees: the phase planes here, expanded planes in ``ExpandedGeometry``
    @property
    def gemm_columns(self) -> int:
        return self.columns

    @property
    def gemm_in_place(self) -> bool:
        return self.in_place

    @property
    def gemm_words(self) -> int:
        return self.words

    @property
    def gemm_plane(self) -> int:
        """Words from one reduction word's pixels to the next's."""
        return self.plane

    @property
    def gemm_flat_rows(self) -> bool:
        """Whether a channel's GEMM row holds its output pixels in NCHW order (no column
        dropped inside it: a 1x1 window, or expanded planes)."""
        return self.phase_w == self.wl.out_w

    def gemm_offsets(self) -> np.ndarray:
        """For each reduction word of the GEMM: where its column 0 lies in its pixels."""
        return self.tap_offsets()

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



@dataclasses.dataclass(frozen=True)
class TileGeometry(Geometry):
    """The layout of a convolution on AMX tiles (``x86_amx_gemm``): columns rounded to whole
    32-pixel register blocks instead of the vector tiles' widths."""

    @property
    def columns(self) -> int:
        pixels = self.wl.out_h * self.phase_w
        return -(-pixels // TILE_BLOCK_COLS) * TILE_BLOCK_COLS


def conv_gemm(geo: Geometry, config: Config, plan: x86_amx_gemm.AmxBlocking | None,
              weight: Buffer, g: Expr, phased: Buffer, base: Expr, taps: Buffer,
              finish: Finish, partial: Buffer | None,
              row_hint: x86_amx_gemm.RowHint | None = None) -> Stmt:
    """A group's GEMM, channel rows x pixel columns: on AMX tiles with ``plan`` (signed
    weights as the tile rows, ``tdpbsud``; or ``tdpbf16ps``), else the vector dot nest
    broadcasting each output channel's weight word (``weight[g][k][word]``)."""
    bf16 = geo.inst.acc_dtype == "float32"
    if plan is not None:
        # an expanded geometry's pixels are its expanded planes (``phased`` is those here)
        operands = x86_amx_gemm.conv_operands("tdpbf16ps" if bf16 else "tdpbsud", weight, g,
                                              phased, base, taps, geo.gemm_words,
                                              geo.gemm_plane)
        return x86_amx_gemm.amx_nest(plan, operands, geo.inst.acc_dtype, finish,
                                     geo.wl.group_out, row_hint)
    nr = config["tile_n"][2]
    return dot_nest(config, geo.inst, a=lambda m, w: weight[g, m, w],
                    b=lambda p, w, j: phased[base + cast("int64", taps[w]) + p * nr + j],
                    finish=finish, partial=partial, swap=True)



def phase_stage(wl: Conv2dInt8 | Conv2dBf16, geo: Geometry, data: Buffer, pad: Expr,
                phased: Buffer, n: Expr, g: Expr,
                encode: Callable[[Expr], Expr] = lambda value: cast("int32", value),
                base: Expr | int = 0) -> Stmt:
    """Image n, group g -> ``phased[phase][channel word][y * Wh + x]``: the padded input's
    ``(y * sh + ph, x * sw + pw)`` as ``encode`` gives it (an int32 below ``2 ** (32 / per_word)``;
    by default a u8 byte's value), ``pad`` where that is padding.

    Threaded over (channel word, phase, row) and vectorized along the row: each lane reads
    the ``per_word`` channels of one pixel from their planes (contiguous along the row for
    stride 1) and stores one word. Walking a pixel's channel words innermost instead read
    bytes a plane apart and ran at about 2 GB/s (0.38 ms of a 0.56 ms 1x1 convolution over
    256 channels at 56x56)."""
    sh, sw = wl.stride
    top, left, _, _ = wl.pad
    per, bits = geo.inst.per_word, 32 // geo.inst.per_word
    if geo.phases == 1 and not any(wl.pad) and wl.group_in % per == 0:
        return _flat_words(wl, geo, data, phased, n, g, encode, base)
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
        value: Expr = encode(data[n, g * wl.group_in + binop("min", c, wl.group_in - 1),
                                cy, column])
        inside = binop("and", ix >= 0, ix < wl.W) if border else None
        if rows_padded:
            inside = row_inside if inside is None else binop("and", row_inside, inside)
        if inside is not None:
            value = Select(inside, value, pad)
        if wl.group_in % per:  # the last word's channels past the group's are zero
            value = Select(c < wl.group_in, value, Const(0, "int32"))
        return value

    def element(border: bool) -> Callable[[Expr], Stmt]:
        def store_word(x: Expr) -> Stmt:
            word: Expr = byte(cw * per, x, border)
            for k in range(1, per):  # wrapping int32 arithmetic: the top byte may set the sign
                word = word + byte(cw * per + k, x, border) * Const(1 << (bits * k), "int32")
            target = phased[base + (phase * geo.channel_words + cw) * geo.plane
                            + y * geo.phase_w + x]
            return store(target, word)

        return store_word

    return rows_loop(*vector_walk(x_lo, element(True), "ph_l"),
                     *vector_walk(x_hi - x_lo, element(False), "ph", start=x_lo),
                     *vector_walk(geo.phase_w - x_hi, element(True), "ph_e", start=x_hi))


def _flat_words(wl: Conv2dInt8 | Conv2dBf16, geo: Geometry, data: Buffer, phased: Buffer,
                n: Expr, g: Expr, encode: Callable[[Expr], Expr], base: Expr | int) -> Stmt:
    """The phase stage of an unpadded stride-1 map (ResNet's 1x1 layers): one phase whose
    rows are the image's, so each channel word's plane is its ``H * W`` pixels in order,
    walked flat (whole registers, where rows of 56 or 14 ended in an odd-sized piece)."""
    per, bits = geo.inst.per_word, 32 // geo.inst.per_word
    cw, words_loop = loop("ph_cw", geo.channel_words, LoopKind.PARALLEL)
    first = g * wl.group_in + cw * per

    def element(q: Expr) -> Stmt:
        word: Expr = encode(data[n, first, 0, q])
        for k in range(1, per):  # wrapping int32 arithmetic: the top byte may set the sign
            word = word + encode(data[n, first + k, 0, q]) * Const(1 << (bits * k), "int32")
        return store(phased[base + cw * geo.plane + q], word)

    return words_loop(*vector_walk(wl.H * wl.W, element, "ph_f"))


def copy_out(geo: Geometry, tiles: Callable[[Expr, Expr], Expr], out: Buffer, n: Expr,
             g: Expr, value: Callable[[Expr, Expr, Expr, Expr], Expr]) -> Stmt:
    """The real pixels of group g's phase-width tiles (``tiles(row, column)``) into NCHW
    ``out`` of image n, each as ``value(tile element, output channel, row, column)`` (the
    epilogue a template applies where every column is a real pixel; row 0 and the flat
    pixel index where the rows hold no dropped column)."""
    wl = geo.wl
    kg, oh_count = wl.group_out, wl.out_h
    if geo.gemm_flat_rows:
        # no column dropped inside the rows (1x1 windows, expanded planes): a channel's tile
        # row holds its pixels in NCHW order, so it is copied as one flat row (a 14x14 map: 12
        # whole registers and 4 lanes, where rows of 14 took an odd-sized vector per output row)
        pixels = wl.out_h * wl.out_w

        def flat(row: Expr, q: Expr) -> Expr:
            return value(tiles(row, q), g * kg + row, Const(0), q)

        return copy_rows(flat, lambda row, q: out[n, g * kg + row, 0, q], kg, pixels)

    def copied(row: Expr, ow: Expr) -> Expr:
        k, oh = g * kg + row // oh_count, row % oh_count
        return value(tiles(row // oh_count, oh * geo.phase_w + ow), k, oh, ow)

    return copy_rows(copied,
                     lambda row, ow: out[n, g * kg + row // oh_count, row % oh_count, ow],
                     kg * oh_count, wl.out_w)


#: from this many (image, group) GEMMs on, the threads split them (each runs its own in one
#: thread, with a workspace of its own) instead of splitting every one: RegNet's grouped layers
#: (13 to 55 groups of 8 channels) ran 2.5-5x slower at 2 threads with a parallel region per group
GROUP_SPLIT = 4


@dataclasses.dataclass(frozen=True)
class ImageGroups:
    """The loop over (image, group) GEMMs both phased templates run, and what it fixes: image
    ``n`` and group ``g`` of an iteration, its workspace ``slot`` (0 unless threads split the
    groups), the ``phased`` workspace (``slots`` of them) and where this iteration's starts."""

    loop: Callable[..., Stmt]
    n: Expr
    g: Expr
    slots: int
    slot: Expr
    phased: Buffer
    base: Expr


def image_groups(geo: Geometry, config: Config) -> ImageGroups:
    wl = geo.wl
    slots, size = group_slots(wl, config), geo.phases * geo.channel_words * geo.plane
    ng, images_loop = loop("ng", wl.N * wl.groups,
                           LoopKind.PARALLEL if slots > 1 else LoopKind.SERIAL)
    slot: Expr = ng if slots > 1 else Const(0)
    phased = Buffer("phased", (slots * size,), Scope.WORKSPACE, "int32")
    return ImageGroups(images_loop, ng // wl.groups, ng % wl.groups, slots, slot, phased,
                       slot * size)


def group_slots(wl: Conv2dInt8 | Conv2dBf16, config: Config) -> int:
    """Workspaces the kernel keeps: one per (image, group) where the threads split those (one K
    block only: the partial-sum workspace is not split), else 1."""
    count = wl.N * wl.groups
    return count if count >= GROUP_SPLIT and config["tile_k"][0] == 1 else 1
