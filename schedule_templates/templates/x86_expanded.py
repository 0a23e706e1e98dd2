"""Expanded planes: convolutions on AMX tiles whose channels do not fill a tile step.

A tile of the pixel operand is 16 reduction words a fixed stride apart; the phase planes of
``x86_int8_phases`` give that only where one tap has 16 channel words (64 int8 channels, 32
bf16 ones). For a single group of fewer channels (an RGB stem) every reduction word gets a
plane of its own after the phase stage (``expand_stage``), and the GEMM reads those.
"""

from __future__ import annotations

import dataclasses

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
    def gemm_columns(self) -> int:
        pixels = self.wl.out_h * self.wl.out_w
        return -(-pixels // TILE_BLOCK_COLS) * TILE_BLOCK_COLS

    @property
    def gemm_in_place(self) -> bool:
        return self.gemm_columns == self.wl.out_h * self.wl.out_w

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
                 expanded_base: Expr) -> list[Stmt]:
    """``expanded[w][oy * out_w + ox]`` = the word reduction word w reads for output pixel
    (oy, ox): a row of its phase plane at the tap's offset, copied whole (contiguous words:
    the phase stage has done the stride and the padding). Threaded over (word, output row).
    The padding planes are zeroed for bf16."""
    wl = geo.wl
    sh, sw = wl.stride
    dh, dw = wl.dilation
    cws = geo.channel_words
    i, rows_loop = loop("ex_i", geo.words * wl.out_h, LoopKind.PARALLEL)
    w, oy = i // wl.out_h, i % wl.out_h
    tap, cw = w // cws, w % cws
    dy, dx = (tap // wl.S) * dh, (tap % wl.S) * dw
    phase = (dy % sh) * sw + dx % sw
    source = ((phase * cws + cw) * geo.plane + (dy // sh) * geo.phase_w + dx // sw
              + oy * geo.phase_w)
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


def gemm_pixels(geo: Geometry, frame: ImageGroups) -> tuple[list[Stmt], Buffer, Expr]:
    """What the GEMM reads its pixel tiles from: (the stages that make it after the phase
    stage, the buffer, this iteration's start in it): the phase planes themselves, or an
    expanded geometry's planes (a workspace of their own)."""
    if not isinstance(geo, ExpandedGeometry):
        return [], frame.phased, frame.base
    size = geo.gemm_words * geo.gemm_columns
    expanded = Buffer("expanded", (frame.slots * size,), Scope.WORKSPACE, "int32")
    start = frame.slot * size
    return expand_stage(geo, frame.phased, frame.base, expanded, start), expanded, start


def padded_words(words: np.ndarray, geo: Geometry) -> np.ndarray:
    """Packed weight words ``[groups][rows][words]`` with zero words up to ``gemm_words``."""
    return np.pad(words, ((0, 0), (0, 0), (0, geo.gemm_words - words.shape[-1])))
