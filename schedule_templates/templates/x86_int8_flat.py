"""Flat reduction words: a single-group convolution with an odd number of input channels (an
RGB stem) in onnxruntime's saturating arithmetic (``weights=sat16``).

onnxruntime's im2col walks a pixel's window tap by tap and, inside a tap, channel by channel,
and ``vpmaddubsw`` sums neighbouring values of that walk in pairs; with 3 channels a pair
joins the last channel of one tap and the first of the next. The phase planes of
``x86_int8_phases`` hold each tap's channels in words of their own (padded to 4), which can
never form such a pair. Here the input stage writes, for every output pixel, the window's
values in onnxruntime's order, 4 to a word (``flat_stage``), one plane per word: the GEMM reads
those planes at fixed offsets, as it reads phase planes, with one "tap" per word, and the
weights are packed in the same order (``flat_weight_words``). It also skips the pad byte of
every 3-channel word: 37 words a pixel for a 7x7 stem instead of 49.
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
    Select,
    Stmt,
    binop,
    cast,
    loop,
    store,
)
from schedule_templates.templates.x86_dot_gemm import as_words
from schedule_templates.templates.x86_int8_phases import Geometry
from schedule_templates.templates.x86_int8_stages import vector_walk
from schedule_templates.workloads import Conv2dInt8

#: values per 32-bit word (bytes)
PER_WORD = 4


def is_flat(wl: object) -> bool:
    """Whether a convolution takes flat words: sat16 with an odd channel count (one group)."""
    return (isinstance(wl, Conv2dInt8) and wl.weights == "sat16" and wl.group_in % 2 == 1
            and wl.groups == 1)


@dataclasses.dataclass(frozen=True)
class FlatGeometry(Geometry):
    """One plane per flat word, each holding that word for every output pixel in order: one
    phase of the output map's own size, ``words`` planes of ``columns`` words."""

    @property
    def values(self) -> int:
        """Values a window holds (taps x channels), onnxruntime's reduction."""
        return self.wl.R * self.wl.S * self.wl.group_in

    @property
    def phases(self) -> int:
        return 1

    @property
    def phase_h(self) -> int:
        return self.wl.out_h

    @property
    def phase_w(self) -> int:
        return self.wl.out_w

    def used_phases(self) -> list[int]:
        return [0]

    @property
    def channel_words(self) -> int:
        return -(-self.values // PER_WORD)

    @property
    def reduction(self) -> int:
        return PER_WORD * self.channel_words

    @property
    def words(self) -> int:
        return self.channel_words

    @property
    def plane(self) -> int:
        return self.columns

    def tap_offsets(self) -> np.ndarray:
        return (np.arange(self.words, dtype=np.int64) * self.plane).astype(np.int32)


def flat_weight_words(weight: np.ndarray, geo: FlatGeometry) -> np.ndarray:
    """s8 ``[K][C][R][S]`` -> int32 words ``[1][K][words]`` of the window in onnxruntime's
    order (taps, then channels), zero bytes after its last value."""
    k = weight.shape[0]
    values = np.zeros((k, geo.reduction), dtype=np.int8)
    values[:, :geo.values] = weight.transpose(0, 2, 3, 1).reshape(k, -1)
    return as_words(values).reshape(1, k, geo.words)


def flat_stage(geo: FlatGeometry, data: Buffer, pad: Expr, planes: Buffer, n: Expr,
               base: Expr) -> Stmt:
    """Image n -> ``planes[w][oy * out_w + ox]``: values ``4w .. 4w + 3`` of output pixel (oy,
    ox)'s window, bytes of the padded input (``pad``, the zero point, outside it; 0 past the
    window's last value), composed in wrapping int32 arithmetic as the phase stage does.
    Threaded over (word, output row), vectorized along the row; columns whose every tap lies
    inside the image read without clamps."""
    wl = geo.wl
    sh, sw = wl.stride
    dh, dw = wl.dilation
    top, left, _, _ = wl.pad
    i, rows_loop = loop("fl_i", geo.words * wl.out_h, LoopKind.PARALLEL)
    w, oy = i // wl.out_h, i % wl.out_h
    # output columns every tap of a row reads inside the image
    x_lo = min(wl.out_w, -(-left // sw))
    x_hi = max(x_lo, min(wl.out_w, (wl.W - 1 + left - (wl.S - 1) * dw) // sw + 1))

    def byte(k: int, ox: Expr, border: bool) -> Expr:
        f = w * PER_WORD + k
        tap, c = f // wl.group_in, f % wl.group_in
        iy = oy * sh + (tap // wl.S) * dh - top
        ix = ox * sw + (tap % wl.S) * dw - left
        row_inside = binop("and", iy >= 0, iy < wl.H)
        cy = binop("min", binop("max", iy, 0), wl.H - 1)
        column = binop("min", binop("max", ix, 0), wl.W - 1) if border else ix
        value: Expr = cast("int32", data[n, binop("min", c, wl.group_in - 1), cy, column])
        inside = binop("and", row_inside, binop("and", ix >= 0, ix < wl.W)) if border \
            else row_inside
        value = Select(inside, value, pad)
        return Select(f < geo.values, value, Const(0, "int32"))

    def element(border: bool) -> Callable[[Expr], Stmt]:
        def store_word(ox: Expr) -> Stmt:
            word: Expr = byte(0, ox, border)
            for k in range(1, PER_WORD):  # wrapping int32: the top byte may set the sign
                word = word + byte(k, ox, border) * Const(1 << (8 * k), "int32")
            return store(planes[base + w * geo.plane + oy * wl.out_w + ox], word)

        return store_word

    return rows_loop(*vector_walk(x_lo, element(True), "fl_l"),
                     *vector_walk(x_hi - x_lo, element(False), "fl", start=x_lo),
                     *vector_walk(wl.out_w - x_hi, element(True), "fl_e", start=x_hi))
