"""The second orientation of the phased convolutions (``conv2d_int8.x86``, ``conv2d_bf16.x86``):
pixel rows, the ``pk_tile`` knob.

The default orientation's columns are phase-width rows rounded up for wide tiles, so on
small maps the dropped columns are much of the work (7x7: 64 columns for 49 pixels; 14x14 with
a 3x3 window: 224 for 196). With ``pk_tile=RxW`` the rows are the real output pixels (a pixel's
word of the phased input broadcast, its address computed per row, so no column is dropped) and
the columns are output channels (16 per register, the weights packed in panels as the dense
kernels' are), R pixels by W channels per register tile (``tile_m`` and ``tile_n`` mean nothing
there and take one value, so no two valid configs are one kernel). Its stores go one lane at a
time into NCHW (a register holds 16 channels of one pixel), which pays where each output takes
many reduction words: the default takes it where that cost is below the dropped columns'.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from schedule_templates.ir.nodes import Buffer, Expr, Stmt, binop, cast
from schedule_templates.space import ChoiceKnob, Config, ConfigSpace, SplitKnob
from schedule_templates.templates import x86_dot_gemm
from schedule_templates.templates.choose import LANES
from schedule_templates.templates.x86_dot_gemm import (
    DotInstruction,
    dot_nest,
    pack_panels,
    partial_buffer,
)
from schedule_templates.templates.x86_int8_phases import Geometry

#: the ``pk_tile`` knob: ``none`` (channel rows) or pixel rows, ``RxW``: R pixels by W output
#: channels per register tile
#: (``5x16``, appended later so older indices keep their meaning: AVX2's int8 instructions,
#: whose accumulators are 5 or 6 of 16 lanes; on Zen 3, ResNet-50's 7x7 layers ran 15-35%
#: faster so and the 14x14 3x3 ones 11-16%, against channel rows with their dropped columns)
PK_TILES = ("none", "6x64", "4x64", "5x64", "7x32", "8x32", "6x32", "4x32", "12x16", "5x16")
#: what one pixel-row register of 16 channels costs to store into NCHW, one lane at a time, in
#: reduction words' time (the default weighs it against the dropped columns it saves)
PK_STORE_WORDS = 16

#: fewer pixels per tile stream each weight panel for too few rows: 4 x 64 ran 6-12% slower than
#: 6 x 64 or 7 x 32 on ResNet-50's 7x7 and 14x14 layers (Zen 5), so the default does not take it
PK_MIN_ROWS = 5
#: pixel rows are taken where their estimated cost is below this share of the channel rows'
#: (with columns rounded for wide tiles, ``Geometry.columns``): ResNet-50's int8 layers on Zen 5,
#: alone, ran faster as pixel rows at 14x14 with a 3x3 window (estimate 0.90 of channel rows) and
#: as channel rows at 28x28 with 3x3 (0.95) and at 14x14 with 1x1 over 1024 channels (0.93)
PK_MARGIN = 0.92

#: (accumulator, output channel within the group, (row, column) of the output) -> the store
StoreOutput = Callable[[Expr, Expr, tuple[Expr, Expr]], Stmt]


def with_pixel_rows(plain: ConfigSpace, kg: int, columns: int, only: bool = False
                    ) -> ConfigSpace:
    """``plain`` (the channel-row space) with the ``pk_tile`` knob appended: its configs keep
    their indices; a pixel-row config has one ``tile_m``/``tile_n`` value. ``only``: pixel
    rows alone are valid (channels-last layers)."""

    def fits(cfg: Config) -> bool:
        tile = pk_tile(cfg)
        if tile is None:
            return not only and plain.constraint is not None and plain.constraint(cfg)
        return (kg % tile[1] == 0 and cfg["tile_m"] == (kg, 1, 1)
                and cfg["tile_n"] == (columns // LANES, 1, LANES)
                and cfg["tile_k"][2] <= x86_dot_gemm.MAX_KU)

    if not only:
        return ConfigSpace((*plain.knobs, ChoiceKnob("pk_tile", PK_TILES, appended=True)),
                           constraint=fits)
    # pixel rows alone: tile_m and tile_n offer little beyond their one pixel-row value, so
    # that random samples of the space find valid configs
    allowed = {"tile_m": (1, kg), "tile_n": (1, columns // LANES, LANES)}
    knobs = tuple(SplitKnob(k.name, k.extent, k.parts, "candidates", allowed[k.name])
                  if isinstance(k, SplitKnob) and k.name in allowed else k for k in plain.knobs)
    return ConfigSpace((*knobs, ChoiceKnob("pk_tile", PK_TILES[1:], appended=True)),
                       constraint=fits)


def default_with_pixel_rows(space: ConfigSpace, plain: Config, geo: Geometry,
                            inst: DotInstruction, forced: bool = False) -> Config:
    """``plain`` (the channel-row default), or its pixel-row twin where that wins (always
    with ``forced``)."""
    pk = pixel_rows_default(geo, inst, forced)
    if pk is None:
        return plain
    return space.from_entities({
        **{name: value for name, _, value in plain.entities},
        "tile_m": (geo.wl.group_out, 1, 1), "tile_n": (geo.columns // LANES, 1, LANES),
        "pk_tile": pk})


def pixel_rows_default(geo: Geometry, inst: DotInstruction, forced: bool = False
                       ) -> str | None:
    """The ``pk_tile`` where pixel rows beat channel rows, else None: the columns the default
    orientation computes against the pixels rounded up to whole tiles, each output paying its
    lane-by-lane store on top of its reduction words (``forced``: the tile alone is chosen).
    Tiles that fit the instruction's accumulators: ``5x16`` on AVX2 (vpmaddubsw's 5, vpmaddwd's
    6: ResNet-50's 7x7 and 14x14 3x3 layers ran 16-27% faster so than as channel rows on Zen 3,
    with either instruction)."""
    wl = geo.wl
    kg = wl.group_out
    if kg % LANES:
        return None
    pixels = wl.out_h * wl.out_w
    # at least PK_MIN_ROWS pixels per tile; among those computing at most 2% more rows than
    # the fewest, the most accumulators, then the widest. ResNet-50's layers alone, Zen 5, int8
    # and bf16: 7x7 maps (49 pixels) run best as 7 x 32 (5 x 64 and 6 x 64 level to 7% slower
    # with 50 and 54 rows), 14x14 ones as 6 x 64 (198 rows: int8 0.232 ms against 0.234 as 7 x 32
    # and 0.249 as 4 x 64; bf16 0.430-0.449 against 0.459-0.464 and 0.484-0.487)
    tiles = [(r, w) for r, w in map(pk_tile_of, PK_TILES[1:])
             if kg % w == 0 and r >= PK_MIN_ROWS]
    # forced on a host of few accumulator registers: the tiles that fit them, if any
    tiles = [(r, w) for r, w in tiles if r * w // LANES <= inst.acc_vectors] or tiles
    if not tiles:
        return None
    fewest = min(-(-pixels // r) * r for r, _ in tiles)
    near = [(r, w) for r, w in tiles if -(-pixels // r) * r <= 1.02 * fewest]
    rows, width = max(near, key=lambda rw: (rw[0] * rw[1], rw[1]))
    computed = -(-pixels // rows) * rows
    if forced:
        return f"{rows}x{width}"
    if computed * (geo.words + PK_STORE_WORDS) >= PK_MARGIN * geo.columns * geo.words:
        return None
    return f"{rows}x{width}"


def pixel_rows_nest(config: Config, geo: Geometry, inst: DotInstruction, phased: Buffer,
                    taps: Buffer, weight: Buffer, g: Expr, store_output: StoreOutput,
                    base: Expr | int = 0, pixel_at: Callable[[Expr], Expr] | None = None
                    ) -> tuple[Stmt, Buffer | None]:
    """The pixel-row GEMM of group ``g`` (weights ``[groups][kg/W][words][W]``, its phased
    input at ``base``) and the partial-sum workspace it needs, if any. ``pixel_at``: where
    output pixel q's words lie in ``phased`` (``x86_channels_last``; by default a phase
    plane's column)."""
    wl = geo.wl
    tile = pk_tile(config)
    assert tile is not None
    kg, pixels = wl.group_out, wl.out_h * wl.out_w
    tiling = pixel_rows_tiling(config, tile, pixels, kg)
    partial = partial_buffer(tiling, tiling["tile_m"][0] * tiling["tile_m"][2], kg, inst)

    def pixel(m: Expr) -> Expr:  # row m's column in a phase plane (last row repeated)
        q = binop("min", m, pixels - 1)
        if pixel_at is not None:
            return pixel_at(q)
        return (q // wl.out_w) * geo.phase_w + q % wl.out_w

    def finish(acc: Expr, m: Expr, j: Expr) -> Stmt:
        return store_output(acc, j, (m // wl.out_w, m % wl.out_w))

    nest = dot_nest(tiling, inst,
                    a=lambda m, w: phased[base + cast("int64", taps[w]) + pixel(m)],
                    b=lambda p, w, j: weight[g, p, w, j], finish=finish, partial=partial,
                    rows=pixels)
    return nest, partial


def pack_pixel_row_weights(values: np.ndarray, groups: int, width: int,
                           inst: DotInstruction) -> np.ndarray:
    """``values[K][taps x padded channels]`` (bytes or 16-bit values, the reduction's order) ->
    panels ``[groups][K/groups/width][words][width]`` of 32-bit words (16 channels' words of
    one reduction step side by side, as one register loads them)."""
    rows = values.reshape(groups, values.shape[0] // groups, -1)
    panels = np.stack([pack_panels(rows[g], width, inst.per_word) for g in range(groups)])
    words = x86_dot_gemm.as_words(panels)
    return words.reshape(groups, rows.shape[1] // width, -1, width)


def pk_tile(config: Config) -> tuple[int, int] | None:
    """(pixels, channels) of a pixel-row config's register tile; None for channel rows (and
    for a space without the knob: ``x86_int8_flat``'s)."""
    try:
        value = str(config["pk_tile"])
    except KeyError:
        return None
    return None if value == "none" else pk_tile_of(value)


def pixel_rows_tiling(config: Config, tile: tuple[int, int], pixels: int, kg: int) -> Config:
    """A pixel-row config as the tiling ``dot_nest`` reads: rows are pixels (``tile[0]`` per
    register tile, the last tile's extra rows computed and not stored), columns channels."""
    rows, width = tile
    tiles = -(-pixels // rows)
    entities = {"tile_m": (tiles, 1, rows), "tile_n": (kg // width, 1, width),
                "tile_k": config["tile_k"], "outer_order": config["outer_order"],
                "inner_order": config["inner_order"], "parallel": config["parallel"]}
    return Config(config.index, tuple((name, "sp" if name.startswith("tile") else "ot", value)
                                      for name, value in entities.items()))


def pk_tile_of(value: str) -> tuple[int, int]:
    rows, width = value.split("x")
    return int(rows), int(width)
