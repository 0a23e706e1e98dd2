"""The dot GEMM on AMX tiles: ``dense_int8`` (``tdpbusd``) and ``conv2d_int8`` (``tdpbsud``) on
hosts whose CPU and kernel give a process the tile registers (Sapphire Rapids and later Xeons).

One tile instruction multiplies 16 rows of 64 bytes of the activations by 16 columns' packed
bytes (VNNI's panel layout, 16 columns a panel) into 16 x 16 int32 sums: 16 times the work of a
``vpdpbusd`` on a zmm register. The register block is ``rows x 2`` tiles of sums (2 x 2: four
sums, two tiles of activations, two of weights, the eight tile registers), kept over the whole
reduction; then stored to a thread's LOCAL block and finished by the usual vectorized output
stage (requantization and any fused addition), rows past M skipped.

The space is the dot GEMM's (``x86_dot_gemm.dot_space``), so a config means something on every
host: here its blocks are read as the work of one parallel task, rounded to whole register
blocks: ``mi * mr`` rows and ``ni * nr`` columns per task, the order and the parallel axis as
they are; the register tile and the K blocking are the hardware's (a device class with AMX
names its ISA level apart, so records never mix with the vector kernels').
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from schedule_templates.ir.amx import TILE_COLS, TILE_ROWS, TILE_WORDS, TileMatmul
from schedule_templates.ir.nodes import (
    Allocate,
    Buffer,
    Expr,
    IfThen,
    Load,
    LoopKind,
    Scope,
    Stmt,
    Var,
    binop,
    cast,
    loop,
)
from schedule_templates.space import Config
from schedule_templates.templates.choose import largest_divisor
from schedule_templates.templates.x86_dot_gemm import block_loops

TILE_K = 4 * TILE_WORDS  # bytes of the reduction one tile step takes
#: input channels of one bf16 tile step (a convolution takes tiles where its groups have
#: whole steps: ``x86_conv2d_bf16``)
BF16_TILE_CHANNELS = 2 * TILE_WORDS
BLOCK_COLS = 2 * TILE_COLS  # columns of one register block
Finish = Callable[[Expr, Expr, Expr], Stmt]  # (accumulator, m, n) -> the output store
#: (row m, the register block's first column) -> statements run once per row before its stores
RowHint = Callable[[Expr, Expr], list[Stmt]]


@functools.cache
def host_amx(dot: str = "tdpbusd") -> bool:
    """Whether this host runs ``dot`` on tiles: LLVM sees the features (the CPU has them and
    the OS saves their state) and Linux grants this process the tile data."""
    from schedule_templates.codegen.llvm_jit import host_features

    needed = {"tdpbusd": "+amx-int8", "tdpbsud": "+amx-int8", "tdpbf16ps": "+amx-bf16"}[dot]
    features = host_features().split(",")
    if "+amx-tile" not in features or needed not in features:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.syscall(ctypes.c_long(158), ctypes.c_long(0x1023),
                                ctypes.c_long(18))) == 0
    except (OSError, AttributeError):
        return False


@dataclasses.dataclass(frozen=True)
class AmxBlocking:
    """The tiling a config means on AMX: ``rows`` x 2 tiles a register block, ``block_m`` x
    ``block_n`` per parallel task; M and N padded to whole register blocks."""

    rows: int
    M: int  # padded
    N: int  # padded
    block_m: int
    block_n: int
    parallel: str
    outer_order: str
    inner_order: str

    @property
    def tile_m(self) -> int:
        return TILE_ROWS * self.rows


def amx_blocking_rows(M: int) -> int:
    """M padded to whole register blocks (16 rows up to 16, else 32)."""
    unit = TILE_ROWS if M <= TILE_ROWS else 2 * TILE_ROWS
    return -(-M // unit) * unit


def amx_blocking(cfg: Config | Mapping[str, Any], M: int, N: int) -> AmxBlocking:
    rows = 1 if M <= TILE_ROWS else 2
    unit_m = TILE_ROWS * rows
    m_units, n_units = -(-M // unit_m), -(-N // BLOCK_COLS)
    _, mi, mr = cfg["tile_m"]
    _, ni, nr = cfg["tile_n"]
    per_m = largest_divisor(m_units, max(1, -(-mi * mr // unit_m)))
    per_n = largest_divisor(n_units, max(1, -(-ni * nr // BLOCK_COLS)))
    return AmxBlocking(rows, m_units * unit_m, n_units * BLOCK_COLS, per_m * unit_m,
                       per_n * BLOCK_COLS, cfg["parallel"], cfg["outer_order"],
                       cfg["inner_order"])


def padded_words(K: int, per_word: int = 4) -> int:
    """32-bit words of a row of K values (``per_word`` a word: 4 bytes or 2 bf16) with K
    padded to whole tile steps (zero weights past K)."""
    return -(-K // (per_word * TILE_WORDS)) * TILE_WORDS


#: (first row or column of a register block, reduction step) -> the operand's first word there
Operand = Callable[[Expr, Expr], Load]


@dataclasses.dataclass(frozen=True)
class TileOperands:
    """Where the tiles of one GEMM lie: ``a(m0, k)`` the word of row m0 starting step k, rows
    ``a_row`` words apart, the next 16 rows ``a_tile`` further; ``b(n0, k)`` likewise for
    column n0, a step's 16 words ``b_row`` apart, the next 16 columns ``b_tile`` further
    (``ir.amx.TileMatmul``)."""

    dot: str
    a: Operand
    a_row: int
    a_tile: int
    b: Operand
    b_row: int
    b_tile: int
    steps: int
    ahead_b: int = 0  # steps ahead to hint ``b`` (``TileMatmul``): weights streamed from memory


def dense_operands(dot: str, a: Buffer, b: Buffer, words: int) -> TileOperands:
    """Rows of ``words`` words in ``a``, panels ``[columns / 16][words][16]`` in ``b``."""
    return TileOperands(dot, lambda m0, k: a[m0, k * TILE_WORDS], words, words * TILE_ROWS,
                        lambda n0, k: b[n0 // TILE_COLS, k * TILE_WORDS, 0], TILE_COLS,
                        words * TILE_COLS, words // TILE_WORDS, ahead_b=1)


def conv_operands(dot: str, weight: Buffer, g: Expr, phased: Buffer, base: Expr, taps: Buffer,
                  words: int, plane: int) -> TileOperands:
    """A direct convolution's GEMM (``x86_int8_phases``): rows are output channels, their
    weights in tiles (``weight_tiles``), columns output pixels; a step of the reduction is 16
    channel words of one tap, a phase plane apart, where ``taps`` says that tap starts."""
    steps = words // TILE_WORDS
    return TileOperands(dot, lambda m0, k: weight[g, m0 // TILE_ROWS, k, 0, 0], TILE_WORDS,
                        steps * TILE_ROWS * TILE_WORDS,
                        lambda n0, k: phased[base + cast("int64", taps[k * TILE_WORDS]) + n0],
                        plane, TILE_COLS, steps)


def weight_tiles(groups: int, rows: int, words: int) -> Buffer:
    """Weights as whole tiles, ``[groups][rows / 16][words / 16][16][16]`` words: one tile
    load reads 1 KB in one piece (rows ``words`` apart ran up to 2.2x slower on ResNet-50's
    7x7 layers, their weights streamed from memory as 16 separate lines a load)."""
    return Buffer("weight_packed", (groups, rows // TILE_ROWS, words // TILE_WORDS, TILE_ROWS,
                                    TILE_WORDS), dtype="int32")


def pack_row_tiles(words: np.ndarray, rows: int) -> np.ndarray:
    """``[groups][kg][words]`` -> ``weight_tiles``' layout, zero rows up to ``rows``."""
    groups, kg, count = words.shape
    padded = np.pad(words, ((0, 0), (0, rows - kg), (0, 0)))
    tiles = padded.reshape(groups, rows // TILE_ROWS, TILE_ROWS, count // TILE_WORDS, TILE_WORDS)
    return np.ascontiguousarray(tiles.transpose(0, 1, 3, 2, 4))


def amx_nest(plan: AmxBlocking, ops: TileOperands, acc_dtype: str, finish: Finish,
             rows: int, row_hint: RowHint | None = None,
             keep: Callable[[Expr], Expr] | None = None) -> Stmt:
    """The blocked nest over ``plan.M`` x ``plan.N``; ``finish`` stores each sum of the rows
    below ``rows`` (and, with ``keep``, of those for which it holds), after ``row_hint``'s
    statements for that row (prefetches) if given."""
    mo, no = plan.M // plan.block_m, plan.N // plan.block_n
    blocks, (jo, io) = block_loops(plan.parallel, plan.outer_order, mo, no)
    ti, ti_loop = loop("amx_m", plan.block_m // plan.tile_m)
    tj, tj_loop = loop("amx_n", plan.block_n // BLOCK_COLS)
    m0 = io * plan.block_m + ti * plan.tile_m
    n0 = jo * plan.block_n + tj * BLOCK_COLS
    acc = Buffer("amx_acc", (plan.tile_m, BLOCK_COLS), Scope.LOCAL, acc_dtype)
    k = Var("amx_k")
    product = TileMatmul(ops.dot, acc, k, ops.steps, ops.a(m0, k), ops.a_row, ops.a_tile,
                         ops.b(n0, k),
                         ops.b_row, ops.b_tile, plan.rows, BLOCK_COLS // TILE_COLS,
                         ops.ahead_b)
    r, r_loop = loop("amx_r", plan.tile_m)
    j, j_loop = loop("amx_j", BLOCK_COLS, LoopKind.VECTORIZE)
    body: list[Stmt] = [*(row_hint(m0 + r, n0) if row_hint is not None else ()),
                        j_loop(finish(acc[r, j], m0 + r, n0 + j))]
    kept = [*(() if rows >= plan.M else (m0 + r < rows,)),
            *(() if keep is None else (keep(m0 + r),))]
    if kept:
        condition = kept[0] if len(kept) == 1 else binop("and", kept[0], kept[1])
        body = [IfThen(condition, tuple(body))]
    tile = Allocate(acc, (product, r_loop(*body)))
    inner = ti_loop(tj_loop(tile)) if plan.inner_order == "mn" else tj_loop(ti_loop(tile))
    return blocks(inner)
