"""Channels-last ``conv2d_int8`` layers on AMX tiles (``conv2d_int8.x86`` where the host has
them): the activations are the tile rows, a pixel's 64 channels one 64-byte tile row.

The GEMM is a dense one: rows are output pixels, columns output channels (their weights packed
in 16-column panels as ``dense_int8``'s), a reduction step one tap's 64 input channels. With the
input channels-last, a step's 16 pixels lie at one word stride (``C/4`` words), so a tile load
reads them where they are: for a 1x1 stride-1 layer the input itself, with no stage at all.
Otherwise each image is first copied into a map of whole words, padded with the activation zero
point and split into ``stride_h * stride_w`` phases (every stride-th row and column), so that tap
``(r, s)`` reads one phase at a fixed word offset from the output pixel. The rows are the
pixels of phase-width rows (``Wh`` per output row, as the NCHW kernels' columns are): the
``Wh - OW`` extra pixels of each row are computed and not stored. The sums come out as 16
channels of one pixel, so a channels-last output is stored a whole register at a time (with the
requantization and any fused shortcut addition: ``requantize``), an NCHW one lane by lane.

An NCHW input (a layer after a pool) is gathered into the map's words in the same stage.
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
from schedule_templates.templates.choose import LANES
from schedule_templates.templates.x86_amx_gemm import TILE_K, TILE_WORDS, AmxBlocking
from schedule_templates.templates.x86_dense_int8 import pack_amx_panels
from schedule_templates.templates.x86_int8_phases import StridePhases
from schedule_templates.templates.x86_int8_stages import vector_walk
from schedule_templates.templates.x86_pixel_rows import StoreOutput, pk_tile
from schedule_templates.workloads import Conv2dInt8

#: a u8 zero point repeated in each byte of a word
_ZP_WORD = 0x01010101


def on_tiles(wl: Conv2dInt8) -> bool:
    """Whether a channels-last layer runs here: one group, whole tile steps of input channels
    (a step stays inside one tap) and whole register blocks of output channels."""
    return (wl.channels_last and wl.groups == 1 and wl.C % TILE_K == 0
            and wl.K % x86_amx_gemm.BLOCK_COLS == 0)


@dataclasses.dataclass(frozen=True)
class TileMap(StridePhases):
    """Where the tile rows lie: the phases of the padded input, as words."""

    wl: Conv2dInt8

    @property
    def channel_words(self) -> int:
        return self.wl.C // 4

    @property
    def staged(self) -> bool:
        """Whether the tiles read a copy (padding, a stride, an NCHW input), not the input."""
        wl = self.wl
        return any(wl.pad) or wl.stride != (1, 1) or wl.in_layout != "nhwc"

    @property
    def rows(self) -> int:
        """Tile rows computed: phase-width rows up to the last output pixel."""
        wl = self.wl
        return (wl.out_h - 1) * self.phase_w + wl.out_w

    @property
    def phase_words(self) -> int:
        return self.phase_h * self.phase_w * self.channel_words

    @property
    def words(self) -> int:
        """Reduction words: taps x channel words."""
        return self.wl.R * self.wl.S * self.channel_words

    def tap_offsets(self) -> np.ndarray:
        """For reduction word ``(r * S + s) * C/4 + cw``: its offset from the row's first word
        (the row's pixel in phase 0)."""
        wl, cw = self.wl, self.channel_words
        sh, sw = wl.stride
        offsets = []
        for r in range(wl.R):
            for s in range(wl.S):
                dy, dx = r * wl.dilation[0], s * wl.dilation[1]
                phase = (dy % sh) * sw + dx % sw
                pixel = (dy // sh) * self.phase_w + dx // sw
                offsets += [phase * self.phase_words + pixel * cw + c for c in range(cw)]
        return np.asarray(offsets, dtype=np.int32)

    def reach(self, plan: AmxBlocking) -> int:
        """Words past a map's (or an image's) start that the tiles read: every padded row's
        step at the farthest tap."""
        return (plan.M - 1) * self.channel_words + int(self.tap_offsets().max()) + TILE_WORDS

    def map_words(self, plan: AmxBlocking) -> int:
        return max(self.phases * self.phase_words, self.reach(plan))

    @property
    def image_words(self) -> int:
        return self.wl.H * self.wl.W * self.channel_words

    def data_buffer(self, plan: AmxBlocking) -> Buffer:
        """The input as the kernel reads it: NCHW bytes, or channels-last words (with slack
        for the rows past the last pixel when the tiles read it in place)."""
        wl = self.wl
        if wl.in_layout != "nhwc":
            return Buffer("data", (wl.N, wl.C, wl.H, wl.W), dtype="uint8")
        slack = 0 if self.staged else max(0, self.reach(plan) - self.image_words)
        return Buffer("data", (wl.N * self.image_words,), dtype="int32", slack=slack)

    def stage(self, data: Buffer, zero_point: Expr, mapped: Buffer, n: Expr) -> Stmt:
        """Image n into ``mapped``: each (phase, row) in parallel; padding the zero point's
        bytes."""
        if self.wl.in_layout == "nhwc":
            return self._words_stage(data, zero_point, mapped, n)
        return self._gather_stage(data, zero_point, mapped, n)

    def _rows(self) -> tuple[Expr, Callable[..., Stmt]]:
        """The parallel loop over the map rows the taps read (one phase's, or all)."""
        return loop("map_i", len(self.used_phases()) * self.phase_h, LoopKind.PARALLEL)

    def _row(self, i: Expr) -> tuple[Expr, Expr, Expr, Expr]:
        """Map row i's phase, the input row it copies, where it starts in the map and whether
        that row is inside the image."""
        wl = self.wl
        used = self.used_phases()
        phase: Expr = i // self.phase_h if len(used) > 1 else Const(used[0])
        y = i % self.phase_h
        iy = y * wl.stride[0] + phase // wl.stride[1] - wl.pad[0]
        return phase, iy, phase * self.phase_words + y * self.phase_w * self.channel_words, \
            binop("and", iy >= 0, iy < wl.H)

    def _words_stage(self, data: Buffer, zero_point: Expr, mapped: Buffer, n: Expr) -> Stmt:
        """A channels-last input: a pixel's words copied whole (16 a register)."""
        wl, cw = self.wl, self.channel_words
        fill = zero_point * Const(_ZP_WORD, "int32")
        i, rows_loop = self._rows()
        phase, iy, start, row_inside = self._row(i)
        x, x_loop = loop("map_x", self.phase_w)
        ix = x * wl.stride[1] + phase % wl.stride[1] - wl.pad[1]
        inside = binop("and", row_inside, binop("and", ix >= 0, ix < wl.W))
        cy = binop("min", binop("max", iy, 0), wl.H - 1)
        cx = binop("min", binop("max", ix, 0), wl.W - 1)
        source = n * self.image_words + (cy * wl.W + cx) * cw
        cb, cb_loop = loop("map_cb", cw // LANES)  # cw is a multiple of 16
        cj, cj_loop = loop("map_cj", LANES, LoopKind.VECTORIZE)
        c = cb * LANES + cj
        body = cb_loop(cj_loop(store(mapped[start + x * cw + c],
                                     Select(inside, data[source + c], fill))))
        return rows_loop(x_loop(body))

    def _gather_stage(self, data: Buffer, zero_point: Expr, mapped: Buffer, n: Expr) -> Stmt:
        """An NCHW input: 16 pixels of a row at a time, four channel planes' bytes (contiguous
        along the row for stride 1) into a word each, stored a pixel's words apart. Walking a
        pixel's words instead gathered each byte a plane apart (1x1 64 -> 64 at 56x56: 0.12
        ms against 0.04 for the same layer reading channels-last words)."""
        wl, cw = self.wl, self.channel_words
        sw, left = wl.stride[1], wl.pad[1]
        fill = zero_point * Const(_ZP_WORD, "int32")
        i, rows_loop = self._rows()
        phase, iy, start, row_inside = self._row(i)
        c, c_loop = loop("map_c", cw)
        cy = binop("min", binop("max", iy, 0), wl.H - 1)
        # columns inside the image in every phase: read without clamps (one load for stride 1)
        x_lo = min(self.phase_w, -(-left // sw))
        x_hi = max(x_lo, min(self.phase_w, (wl.W - sw + left) // sw + 1))

        def element(border: bool) -> Callable[[Expr], Stmt]:
            def store_word(x: Expr) -> Stmt:
                ix = x * sw + phase % sw - left
                column = binop("min", binop("max", ix, 0), wl.W - 1) if border else ix
                word: Expr = cast("int32", data[n, c * 4, cy, column])
                for k in range(1, 4):  # wrapping int32 arithmetic: the top byte sets the sign
                    word = word + cast("int32", data[n, c * 4 + k, cy, column]) * Const(
                        1 << (8 * k), "int32")
                inside = row_inside if not border else binop(
                    "and", row_inside, binop("and", ix >= 0, ix < wl.W))
                return store(mapped[start + x * cw + c], Select(inside, word, fill))

            return store_word

        return rows_loop(c_loop(*vector_walk(x_lo, element(True), "map_l"),
                                *vector_walk(x_hi - x_lo, element(False), "map",
                                             start=x_lo),
                                *vector_walk(self.phase_w - x_hi, element(True), "map_e",
                                             start=x_hi)))


def blocking(config: Config, tiles: TileMap) -> AmxBlocking:
    """The config's tiling on tiles: its pixel-row register tile (``pk_tile=RxW``) read as a
    parallel task's block, ``32R`` rows of pixels by ``2W`` channels (rounded to whole register
    blocks of 32 x 32); the orders and the parallel axis as they are."""
    tile = pk_tile(config)
    rows, width = tile if tile is not None else (4, 32)
    entities = {"tile_m": (1, 32 * rows, 1), "tile_n": (1, 2 * width, 1),
                "parallel": config["parallel"], "outer_order": config["outer_order"],
                "inner_order": config["inner_order"]}
    return x86_amx_gemm.amx_blocking(entities, tiles.rows, tiles.wl.K)


def tiles_nest(config: Config, tiles: TileMap, data: Buffer, weight: Buffer, taps: Buffer,
               zero_point: Expr, n: Expr, store_output: StoreOutput
               ) -> tuple[list[Stmt], list[Buffer]]:
    """Image n's stage (if any) and GEMM; the workspaces they use. The weight tiles are not
    hinted ahead (as ``dense_int8``'s are): each is 1 KB in one piece, which the hardware
    prefetcher streams, and the 16 hints a step cost more than they saved (512 -> 128 1x1 at
    28x28 alone 0.0615 -> 0.0565 ms without them, 7x7 3x3 over 512 channels 0.132 -> 0.127)."""
    wl, cw = tiles.wl, tiles.channel_words
    plan = blocking(config, tiles)
    stages: list[Stmt] = []
    workspaces: list[Buffer] = []
    if tiles.staged:
        source = Buffer("mapped", (tiles.map_words(plan),), Scope.WORKSPACE, "int32")
        workspaces.append(source)
        stages.append(tiles.stage(data, zero_point, source, n))
        base: Expr = Const(0)
    else:
        source, base = data, n * tiles.image_words
    steps = tiles.words // TILE_WORDS
    operands = x86_amx_gemm.TileOperands(
        "tdpbusd", lambda m0, k: source[base + m0 * cw + cast("int64", taps[k * TILE_WORDS])],
        cw, cw * x86_amx_gemm.TILE_ROWS,
        lambda n0, k: weight[n0 // x86_amx_gemm.TILE_COLS, k * TILE_WORDS, 0],
        x86_amx_gemm.TILE_COLS, tiles.words * x86_amx_gemm.TILE_COLS, steps)

    def finish(acc: Expr, m: Expr, k: Expr) -> Stmt:
        return store_output(acc, k, (m // tiles.phase_w, m % tiles.phase_w))

    def keep(m: Expr) -> Expr:
        return m % tiles.phase_w < wl.out_w

    nest = x86_amx_gemm.amx_nest(plan, operands, "int32", finish, tiles.rows,
                                 keep=keep if tiles.phase_w != wl.out_w else None)
    return [*stages, nest], workspaces


def pack_weights(wl: Conv2dInt8, config: Config, weight: np.ndarray) -> np.ndarray:
    """s8 ``[K][C][R][S]`` -> ``dense_int8``'s AMX panels over the reduction ``(r, s, c)``."""
    plan = blocking(config, TileMap(wl))
    rows = np.ascontiguousarray(weight.transpose(0, 2, 3, 1)).reshape(wl.K, -1)
    return pack_amx_panels(rows, plan.N)
