"""Channels-last activations for ``conv2d_int8.x86`` (``in_layout``/``out_layout`` ``nhwc``).

A channels-last layer runs as pixel rows (``x86_pixel_rows``): a register holds 16 output
channels of one pixel, so with the output ``[N][OH][OW][K]`` it is stored whole (in NCHW each
lane went to its own plane, one byte at a time), and the input's four channels of a pixel are
one word already, which the nest broadcasts where it lies: no phase stage. Without padding
(ResNet's 1x1 layers, strided or not) the nest reads the input itself; with padding, each
image is first copied into a zero-point-padded ``[H + top + bottom][W + left + right][C/4]``
word map (contiguous rows, no byte shuffling), and every tap reads that at a fixed offset.
On hosts without VNNI (``vpmaddwd``: two channels widened to 16 bits per word) the map is
always made, of such words.

Reduction word ``(r * S + s) * C/4 + cw`` of output pixel ``(oy, ox)`` lies at
``((oy * sh + r * dh) * Wp + ox * sw + s * dw) * C/4 + cw`` of the (padded) map: the tap part
is the packed ``tap_offsets``, the pixel part ``pixel_offset``.
"""

from __future__ import annotations

import dataclasses

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
from schedule_templates.templates.x86_int8_stages import vector_walk
from schedule_templates.workloads import Conv2dInt8

#: a u8 zero point repeated in each value of a word (4 bytes, or two 16-bit values)
_ZP_REPEATED = {4: 0x01010101, 2: 0x00010001}


@dataclasses.dataclass(frozen=True)
class ChannelsLast:
    """Where a channels-last input's words lie: the padded map's extents and word counts."""

    wl: Conv2dInt8
    #: channels per word the kernel reads: 4 bytes (VNNI) or two 16-bit values (vpmaddwd)
    per_word: int = 4

    @property
    def channel_words(self) -> int:
        return self.wl.C // self.per_word

    @property
    def staged(self) -> bool:
        """Whether the kernel reads a padded (or widened) copy, not the input itself."""
        return any(self.wl.pad) or self.per_word != 4

    @property
    def map_h(self) -> int:
        top, _, bottom, _ = self.wl.pad
        return self.wl.H + top + bottom

    @property
    def map_w(self) -> int:
        _, left, _, right = self.wl.pad
        return self.wl.W + left + right

    @property
    def map_words(self) -> int:
        """Words of one image's (padded) map."""
        return self.map_h * self.map_w * self.channel_words

    def data_buffer(self) -> Buffer:
        """The u8 ``[N][H][W][C]`` input as the kernel reads it: a word per 4 channels (its
        bytes, where they are widened into the map)."""
        wl = self.wl
        if self.per_word != 4:
            return Buffer("data", (wl.N * wl.H * wl.W * wl.C,), dtype="uint8")
        return Buffer("data", (wl.N * self.image_words,), dtype="int32")

    @property
    def image_words(self) -> int:
        """Words of one image of the (unpadded) input."""
        return self.wl.H * self.wl.W * self.channel_words

    def tap_offsets(self) -> np.ndarray:
        """For each reduction word ``(r * S + s) * C/4 + cw``: its offset from the pixel's."""
        wl, cw = self.wl, self.channel_words
        offsets = [(r * wl.dilation[0] * self.map_w + s * wl.dilation[1]) * cw + c
                   for r in range(wl.R) for s in range(wl.S) for c in range(cw)]
        return np.asarray(offsets, dtype=np.int32)

    def pixel_offset(self, q: Expr) -> Expr:
        """Where output pixel ``q`` (row-major) reads its window's first word."""
        wl = self.wl
        oy, ox = q // wl.out_w, q % wl.out_w
        return (oy * (wl.stride[0] * self.map_w) + ox * wl.stride[1]) * self.channel_words

    def padded_buffer(self, slots: int) -> Buffer:
        return Buffer("padded", (slots * self.map_words,), Scope.WORKSPACE, "int32")

    def pad_stage(self, data: Buffer, zero_point: Expr, padded: Buffer, n: Expr,
                  base: Expr) -> Stmt:
        """Image n's words into ``padded`` at ``base``: each padded row in parallel, the
        border and the rows outside the image the zero point's bytes, the inside a copy."""
        wl, cw = self.wl, self.channel_words
        top, left, _, _ = wl.pad
        fill = zero_point * Const(_ZP_REPEATED[self.per_word], "int32")
        y, rows_loop = loop("pad_y", self.map_h, LoopKind.PARALLEL)
        iy = y - top
        inside = binop("and", iy >= 0, iy < wl.H)
        row = binop("min", binop("max", iy, 0), wl.H - 1) * (wl.W * cw)
        start = base + y * (self.map_w * cw)

        def border(e: Expr) -> Stmt:
            return store(padded[start + e], fill)

        def copied(e: Expr) -> Stmt:
            value: Expr
            if self.per_word == 4:
                value = data[n * self.image_words + row + e - left * cw]
            else:  # two channels' bytes widened into the halves of a word
                at = n * self.image_words + row + e - left * cw
                value = (cast("int32", data[at * 2])
                         + cast("int32", data[at * 2 + 1]) * Const(1 << 16, "int32"))
            return store(padded[start + e], Select(inside, value, fill))

        return rows_loop(*vector_walk(left * cw, border, "pad_l"),
                         *vector_walk(wl.W * cw, copied, "pad_c", start=left * cw),
                         *vector_walk(self.map_w * cw - (left + wl.W) * cw, border, "pad_r",
                                      start=(left + wl.W) * cw))
