"""Tile statements: x86 AMX matrix instructions, which work on whole tiles of registers.

A ``TileMatmul`` is one register block of a GEMM computed with AMX: ``rows x cols`` tiles of
16 x 16 int32 (or fp32) sums, each over the whole reduction, written to a LOCAL buffer. The
LLVM generator emits it as tile loads and tile dot products over the reduction's steps (one
step: 16 words, 64 bytes, of every row); every other pass runs its ``expand()``: the same sums
in ordinary nodes (``dp4a``, or AVX-512 BF16's pair step), which is what a host without AMX
would compute.
"""

from __future__ import annotations

import dataclasses

from schedule_templates.ir.nodes import (
    Buffer,
    Const,
    Expr,
    Load,
    Loop,
    LoopKind,
    Stmt,
    Store,
    Var,
    intrinsic,
    loop,
)

#: rows of one tile, 32-bit words per tile row (64 bytes), accumulator columns per tile
TILE_ROWS, TILE_WORDS, TILE_COLS = 16, 16, 16
#: tile registers of the architecture
TILE_REGISTERS = 8
#: the tile dot products and their accumulator type: ``tdpbusd`` takes u8 rows of ``a`` and
#: s8 of ``b``, ``tdpbsud`` s8 of ``a`` and u8 of ``b``, ``tdpbf16ps`` bf16 pairs of both
TILE_DOTS = {"tdpbusd": "int32", "tdpbsud": "int32", "tdpbf16ps": "float32"}


@dataclasses.dataclass(frozen=True, eq=False)
class TileMatmul(Stmt):
    """``acc[r, c] = sum over steps s, words w < 16 of dot(A(s, r, w), B(s, w, c))`` for
    ``r < 16 * rows``, ``c < 16 * cols``, where (offsets added to the last index, that is to
    the flat position in the buffer)

    * ``A(s, r, w) = a[..., last + (r // 16) * a_tile + (r % 16) * a_row + w]``, ``step = s``
      in ``a``'s indices: a tile of ``a`` is 16 rows of 16 words, ``a_row`` elements apart,
      the next tile of rows ``a_tile`` elements further;
    * ``B(s, w, c) = b[..., last + (c // 16) * b_tile + w * b_row + c % 16]``, ``step = s``:
      one tile of ``b`` is 16 rows (words of the reduction) of 16 words (columns), ``b_row``
      elements apart, and the next tile of columns ``b_tile`` elements further.

    Hints (``ahead_b``) change no result: a tile load that misses the caches waits for each
    of its 16 rows, so a dense layer's weights, streamed from memory, are hinted a step ahead
    (BERT's 128x768x3072 int8 dense 0.415 -> 0.374 ms).

    Both buffers hold 32-bit words (4 u8 or s8, or 2 bf16 values each). ``acc`` is a LOCAL
    buffer of ``(16 * rows, 16 * cols)`` accumulators, overwritten. The tile registers hold
    ``rows * cols`` sums, ``rows`` tiles of ``a`` and ``cols`` of ``b``: at most 8 in all."""

    dot: str
    acc: Buffer
    step: Var
    steps: int
    a: Load
    a_row: int
    a_tile: int
    b: Load
    b_row: int
    b_tile: int
    rows: int
    cols: int
    #: hint the rows of ``b`` this many steps ahead towards the core (0: none); a hint past
    #: the reduction's end falls on what follows it, and a hint never faults
    ahead_b: int = 0

    def __post_init__(self) -> None:
        if self.dot not in TILE_DOTS:
            raise ValueError(f"unknown tile dot {self.dot!r}; known: {', '.join(TILE_DOTS)}")
        if self.rows * self.cols + self.rows + self.cols > TILE_REGISTERS:
            raise ValueError(f"{self.rows} x {self.cols} tiles need more than "
                             f"{TILE_REGISTERS} tile registers")
        if self.steps <= 0:
            raise ValueError(f"a tile reduction takes at least one step, got {self.steps}")
        if self.acc.shape != (TILE_ROWS * self.rows, TILE_COLS * self.cols):
            raise ValueError(f"accumulators {self.acc.shape} are not {self.rows} x {self.cols} "
                             f"tiles")
        if self.acc.dtype != TILE_DOTS[self.dot]:
            raise ValueError(f"{self.dot} accumulates in {TILE_DOTS[self.dot]}")

    def a_at(self, r: Expr | int, w: Expr | int) -> Load:
        *lead, last = self.a.indices
        tile, row = (r // TILE_ROWS, r % TILE_ROWS)
        return Load(self.a.buffer, (*lead, last + tile * self.a_tile + row * self.a_row + w))

    def b_at(self, w: Expr | int, tile: Expr | int, j: Expr | int) -> Load:
        *lead, last = self.b.indices
        return Load(self.b.buffer, (*lead, last + tile * self.b_tile + w * self.b_row + j))

    def expand(self) -> Stmt:
        """The same sums, lane by lane (16 lanes of one tile row a vector)."""
        r, over_r = loop("tile_r", TILE_ROWS * self.rows)
        t, over_t = loop("tile_c", self.cols, LoopKind.UNROLL)
        j, over_j = loop("tile_j", TILE_COLS, LoopKind.VECTORIZE)
        w, over_w = loop("tile_w", TILE_WORDS)
        target = Load(self.acc, (r, t * TILE_COLS + j))
        zero: Expr = Const(0.0, "float32") if self.dot == "tdpbf16ps" else Const(0, "int32")
        value = _dot(self.dot, target, self.a_at(r, w), self.b_at(w, t, j))
        steps = Loop(self.step, self.steps, LoopKind.SERIAL,
                     (over_w(Store(self.acc, target.indices, value)),))
        return over_r(over_t(over_j(Store(self.acc, target.indices, zero), steps)))


def _dot(dot: str, acc: Expr, a: Expr, b: Expr) -> Expr:
    # dp4a is vpdpbusd's arithmetic at any width (its first operand the unsigned one)
    if dot == "tdpbusd":
        return intrinsic("dp4a", acc, a, b)
    if dot == "tdpbsud":
        return intrinsic("dp4a", acc, b, a)
    return intrinsic("dpbf16ps", acc, a, b)
