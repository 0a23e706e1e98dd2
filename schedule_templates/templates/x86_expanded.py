"""Expanded planes: convolutions on AMX tiles whose channels do not fill a tile step.

A tile of the pixel operand is 16 reduction words a fixed stride apart; the phase planes of
``x86_int8_phases`` give that only where one tap has 16 channel words (64 int8 channels, 32
bf16 ones). For a single group of fewer channels (an RGB stem) every reduction word gets a
plane of its own after the phase stage (``expand_stage``), and the GEMM reads those.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from schedule_templates.ir.amx import TILE_WORDS
from schedule_templates.ir.nodes import Buffer, Const, Expr, LoopKind, Scope, Stmt, loop, store
from schedule_templates.templates.x86_int8_phases import (
    TILE_BLOCK_COLS,
    Geometry,
    ImageGroups,
    TileGeometry,
)
from schedule_templates.templates.x86_int8_stages import vector_walk
from schedule_templates.workloads import Conv2dBf16, Conv2dInt8

#: bytes of expanded planes per band: half of a core's L2 on the Xeons with AMX (2 MB), so the
#: GEMM reads them where the expansion wrote them
BAND_BYTES = 1 << 19

@dataclasses.dataclass(frozen=True)
class ExpandedGeometry(TileGeometry):
    """A convolution on tiles whose channels do not fill a tile step (64 bytes of one tap:
    ResNet's 3-channel stem). A tile of the pixel operand is 16 reduction words a fixed
    stride apart, which channel words of one tap are only where a tap has 16 of them; so
    every reduction word (tap, channel word) gets a plane of its own, the phase plane it
    reads shifted by the tap's offset (``expand_stage``): an im2col of words. Its columns
    are the output pixels themselves (no phase-width rows: the shift is done), so a map of
    a multiple of 32 pixels is stored in place, and the words are padded to whole tile
    steps with planes that zero weights multiply (left as they are in int8, where any
    integer times zero is zero; zeroed in bf16, where stale bits could be a NaN)."""

    @property
    def band_rows(self) -> int:
        """Output rows expanded and multiplied at a time: the most rows whose planes fit
        ``BAND_BYTES`` (so the GEMM reads them from L2, not from memory), among those that
        divide the map into whole 32-pixel blocks (stored in place); the whole map else."""
        wl = self.wl
        fits = [rows for rows in range(1, wl.out_h + 1)
                if wl.out_h % rows == 0 and rows * wl.out_w % TILE_BLOCK_COLS == 0
                and 4 * self.gemm_words * rows * wl.out_w <= BAND_BYTES]
        return max(fits, default=wl.out_h)

    @property
    def bands(self) -> int:
        return self.wl.out_h // self.band_rows

    @property
    def gemm_columns(self) -> int:
        pixels = self.band_rows * self.wl.out_w
        return -(-pixels // TILE_BLOCK_COLS) * TILE_BLOCK_COLS

    @property
    def gemm_in_place(self) -> bool:
        return self.gemm_columns == self.band_rows * self.wl.out_w

    @property
    def gemm_plane(self) -> int:
        return self.gemm_columns

    @property
    def gemm_flat_rows(self) -> bool:
        return True

    @property
    def gemm_words(self) -> int:
        """Reduction words padded to whole tile steps (16 words, 64 bytes)."""
        return -(-self.words // TILE_WORDS) * TILE_WORDS

    def gemm_offsets(self) -> np.ndarray:
        """For reduction word w: where its plane starts in the expanded workspace."""
        return (np.arange(self.gemm_words, dtype=np.int64) * self.gemm_columns).astype(np.int32)


def expands(wl: Conv2dInt8 | Conv2dBf16, per_word: int) -> bool:
    """Whether a convolution on tiles takes expanded planes: one group (grouped layers'
    small GEMMs keep the vector kernel) of fewer channels than a tile step (16 words of
    ``per_word`` channels), with at least half a step of reduction words; whole steps read
    the phase planes as they are."""
    cw = -(-wl.group_in // per_word)
    return (wl.groups == 1 and wl.group_in < per_word * TILE_WORDS
            and 2 * wl.R * wl.S * cw >= TILE_WORDS)


def expand_stage(geo: ExpandedGeometry, phased: Buffer, base: Expr, expanded: Buffer,
                 expanded_base: Expr, band: Expr) -> list[Stmt]:
    """``expanded[w][oy * out_w + ox]`` = the word reduction word w reads for output pixel
    (band * band_rows + oy, ox): a row of its phase plane at the tap's offset, copied whole
    (contiguous words: the phase stage has done the stride and the padding). Threaded over
    (word, output row). The padding planes are zeroed for bf16."""
    wl = geo.wl
    sh, sw = wl.stride
    dh, dw = wl.dilation
    cws = geo.channel_words
    rows = geo.band_rows
    i, rows_loop = loop("ex_i", geo.words * rows, LoopKind.PARALLEL)
    w, oy = i // rows, i % rows
    tap, cw = w // cws, w % cws
    dy, dx = (tap // wl.S) * dh, (tap % wl.S) * dw
    phase = (dy % sh) * sw + dx % sw
    source = ((phase * cws + cw) * geo.plane + (dy // sh) * geo.phase_w + dx // sw
              + (band * rows + oy) * geo.phase_w)
    target = w * geo.gemm_columns + oy * wl.out_w

    def element(ox: Expr) -> Stmt:
        return store(expanded[expanded_base + target + ox], phased[base + source + ox])

    stages = [rows_loop(*vector_walk(wl.out_w, element, "ex"))]
    padding = (geo.gemm_words - geo.words) * geo.gemm_columns
    if padding and geo.inst.acc_dtype == "float32":
        z, zeros_loop = loop("ex_z", padding // TILE_BLOCK_COLS, LoopKind.PARALLEL)
        start = expanded_base + geo.words * geo.gemm_columns + z * TILE_BLOCK_COLS
        stages.append(zeros_loop(*vector_walk(
            TILE_BLOCK_COLS, lambda q: store(expanded[start + q], Const(0, "int32")), "ex_z")))
    return stages


@dataclasses.dataclass(frozen=True)
class GemmPixels:
    """Where the GEMM reads its pixel tiles: ``buffer`` from ``base`` (the phase planes, or
    an expanded geometry's planes), made by ``stages`` after the phase stage; the GEMM's
    column 0 is output pixel ``column0`` (a band's first), and ``bands`` wraps the stages and
    the GEMM into the loop over bands (as they are where there is one)."""

    stages: list[Stmt]
    buffer: Buffer
    base: Expr
    column0: Expr
    bands: Callable[[list[Stmt]], list[Stmt]]


def gemm_pixels(geo: Geometry, frame: ImageGroups) -> GemmPixels:
    if not isinstance(geo, ExpandedGeometry):
        return GemmPixels([], frame.phased, frame.base, Const(0), lambda body: body)
    size = geo.gemm_words * geo.gemm_columns
    expanded = Buffer("expanded", (frame.slots * size,), Scope.WORKSPACE, "int32")
    start = frame.slot * size
    if geo.bands == 1:
        return GemmPixels(expand_stage(geo, frame.phased, frame.base, expanded, start,
                                       Const(0)), expanded, start, Const(0), lambda body: body)
    band, band_loop = loop("ex_band", geo.bands)
    return GemmPixels(expand_stage(geo, frame.phased, frame.base, expanded, start, band),
                      expanded, start, band * (geo.band_rows * geo.wl.out_w),
                      lambda body: [band_loop(*body)])


def padded_words(words: np.ndarray, geo: Geometry) -> np.ndarray:
    """Packed weight words ``[groups][rows][words]`` with zero words up to ``gemm_words``."""
    return np.pad(words, ((0, 0), (0, 0), (0, geo.gemm_words - words.shape[-1])))
