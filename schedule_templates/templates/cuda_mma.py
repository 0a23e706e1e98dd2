"""A tensor-core int8 GEMM for CUDA: ``C[m, n] = sum_k A[m, k] B[n, k]`` over words of four
bytes (u8 rows of A, s8 rows of B), each step one warp-wide ``mma.sync.m16n8k32``
(``WarpMma``), int32 accumulation, an output stage applied as the accumulators are stored.

A block computes a ``BM x BN`` tile with ``warps_m x warps_n`` warps; each warp holds
``frags_m x frags_n`` 16 x 8 accumulator fragments (four int32 per lane each). For every slice
of ``tile_k`` words of the reduction the block copies both operand tiles into shared memory as
they lie (rows of words, vector loads where the row length allows), padded by 4 words per row so
that the fragment reads of a warp (8 rows x 4 words) hit 32 different banks; then every warp runs
its fragments' instructions over the slice. Tiles need not divide the problem: rows and words
outside it read clamped addresses and are zeroed, outputs outside it are not stored.

Nothing here is pipelined yet (no ``cp.async`` double buffering, no ``ldmatrix``): the first
tensor-core step, measured against cuBLASLt's int8 in docs/cuda.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from schedule_templates.ir.nodes import (
    Allocate,
    Barrier,
    Buffer,
    Const,
    Expr,
    IfThen,
    Load,
    LoopKind,
    Scope,
    Select,
    Stmt,
    binop,
    loop,
    store,
)
from schedule_templates.ir.warp import MMA_COLS, MMA_ROWS, MMA_WORDS, WarpMma
from schedule_templates.space import ChoiceKnob, Config, ConfigSpace
from schedule_templates.templates.cuda_tiling import (
    MAX_GRID_YZ,
    REGISTER_OVERHEAD,
    DeviceLimits,
    ceil_div,
    tile_cap,
    vector_width,
)

WARP = 32
#: words of padding per shared row (a warp's fragment reads then avoid bank conflicts)
ROW_PAD = 4

#: (words, row) -> the operand word, indices already in range
WordFn = Callable[[Expr, Expr], Expr]
#: (accumulator, row, column) -> the value stored
FinishFn = Callable[[Expr, Expr, Expr], Expr]


@dataclasses.dataclass(frozen=True)
class MmaTiles:
    warps_m: int
    warps_n: int
    frags_m: int
    frags_n: int
    words: int

    @classmethod
    def of(cls, cfg: Config) -> MmaTiles:
        return cls(cfg["warps_m"], cfg["warps_n"], cfg["frags_m"], cfg["frags_n"],
                   cfg["tile_k_words"])

    @property
    def bm(self) -> int:
        return self.warps_m * self.frags_m * MMA_ROWS

    @property
    def bn(self) -> int:
        return self.warps_n * self.frags_n * MMA_COLS

    @property
    def threads(self) -> int:
        return WARP * self.warps_m * self.warps_n

    @property
    def shared_bytes(self) -> int:
        return 4 * (self.bm + self.bn) * (self.words + ROW_PAD)

    @property
    def registers(self) -> int:
        """Accumulators, one instruction's six fragment words, two vector loads, overhead."""
        return 4 * self.frags_m * self.frags_n + 6 + 8 + REGISTER_OVERHEAD


def mma_space(M: int, N: int, words: int, device: Mapping[str, Any] | None) -> ConfigSpace:
    limits = DeviceLimits.from_device(device)

    def valid(cfg: Config) -> bool:
        t = MmaTiles.of(cfg)
        return (t.bm <= max(MMA_ROWS, tile_cap(M)) and t.bn <= max(MMA_COLS, tile_cap(N))
                and t.words <= max(MMA_WORDS, tile_cap(words))
                and ceil_div(M, t.bm) <= MAX_GRID_YZ
                and limits.fits(t.threads, t.shared_bytes, t.registers))

    knobs = (ChoiceKnob("warps_m", (1, 2, 4)), ChoiceKnob("warps_n", (1, 2, 4)),
             ChoiceKnob("frags_m", (1, 2, 4)), ChoiceKnob("frags_n", (1, 2, 4, 8)),
             ChoiceKnob("tile_k_words", (8, 16, 32)))
    return ConfigSpace(knobs, constraint=valid)


#: default shapes, best first: (warps_m, warps_n, frags_m, frags_n, words)
_DEFAULTS = ((2, 2, 4, 4, 16), (2, 2, 2, 4, 16), (2, 2, 2, 2, 16), (1, 2, 2, 2, 16),
             (1, 2, 1, 2, 8), (1, 1, 1, 2, 8), (1, 1, 1, 1, 8))


def mma_default(space: ConfigSpace, M: int, N: int) -> Config:
    """The first valid default shape that gives every multiprocessor a block, else the first
    valid one (the smallest always is)."""
    first: Config | None = None
    for wm, wn, fm, fn, words in _DEFAULTS:
        cfg = space.from_entities({"warps_m": wm, "warps_n": wn, "frags_m": fm, "frags_n": fn,
                                   "tile_k_words": words})
        if not space.is_valid(cfg.index):
            continue
        t = MmaTiles.of(cfg)
        if ceil_div(M, t.bm) * ceil_div(N, t.bn) >= DeviceLimits().multiprocessor_count:
            return cfg
        first = first or cfg
    if first is None:
        raise ValueError("no valid tensor-core GEMM config")
    return first


@dataclasses.dataclass(frozen=True)
class MmaOperand:
    """Rows of words: ``rows`` of them, ``words`` long, ``load(row, word)``; ``vec`` the widest
    vector load a row allows (it divides ``words``)."""

    rows: int
    vec: int
    load: WordFn


def mma_nest(t: MmaTiles, M: int, N: int, words: int, a: MmaOperand, b: MmaOperand,
             out: Callable[[Expr, Expr], Load], finish: FinishFn) -> Stmt:
    by, y_loop = loop("bm", ceil_div(M, t.bm), LoopKind.BLOCK_Y)
    bx, x_loop = loop("bn", ceil_div(N, t.bn), LoopKind.BLOCK_X)
    a_sh = Buffer("A_shared", (t.bm, t.words + ROW_PAD), Scope.SHARED, "int32")
    b_sh = Buffer("B_shared", (t.bn, t.words + ROW_PAD), Scope.SHARED, "int32")
    acc = Buffer("acc", (t.frags_m, t.frags_n, 4), Scope.LOCAL, "int32")
    m0, n0 = by * t.bm, bx * t.bn

    def fragments(body: Callable[[Expr, Expr], Stmt]) -> Stmt:
        fm, fm_loop = loop("f_m", t.frags_m, LoopKind.UNROLL)
        fn, fn_loop = loop("f_n", t.frags_n, LoopKind.UNROLL)
        return fm_loop(fn_loop(body(fm, fn)))

    i, i_loop = loop("i", 4, LoopKind.UNROLL)
    init = _warps(t, lambda _w, _l: fragments(
        lambda fm, fn: i_loop(store(acc[fm, fn, i], Const(0, "int32")))))

    ko, k_outer = loop("k_o", ceil_div(words, t.words))
    k0 = ko * t.words

    def load_phase(warp: Expr, lane: Expr) -> list[Stmt]:
        tid = warp * WARP + lane
        return [_tile_load(t, a, a_sh, m0, t.bm, k0, words, tid, "a"),
                _tile_load(t, b, b_sh, n0, t.bn, k0, words, tid, "b")]

    def compute(warp: Expr, lane: Expr) -> Stmt:
        wm, wn = warp // t.warps_n, warp % t.warps_n
        ks, ks_loop = loop("k_s", t.words // MMA_WORDS, LoopKind.UNROLL)
        return ks_loop(fragments(lambda fm, fn: WarpMma(
            acc[fm, fn, 0],
            a_sh[(wm * t.frags_m + fm) * MMA_ROWS, ks * MMA_WORDS],
            b_sh[(wn * t.frags_n + fn) * MMA_COLS, ks * MMA_WORDS],
            lane)))

    main = k_outer(_warps(t, load_phase), Barrier(), _warps(t, compute), Barrier())

    def store_phase(warp: Expr, lane: Expr) -> Stmt:
        wm, wn = warp // t.warps_n, warp % t.warps_n
        group, pair = lane // 4, lane % 4

        def element(fm: Expr, fn: Expr) -> Stmt:
            j, j_loop = loop("i", 4, LoopKind.UNROLL)
            m = m0 + (wm * t.frags_m + fm) * MMA_ROWS + group + (j // 2) * 8
            n = n0 + (wn * t.frags_n + fn) * MMA_COLS + pair * 2 + j % 2
            value = store(out(m, n), finish(acc[fm, fn, j], m, n))
            guards = [c for c, needed in ((m < M, M % t.bm), (n < N, N % t.bn)) if needed]
            if not guards:
                return j_loop(value)
            cond = guards[0] if len(guards) == 1 else binop("and", guards[0], guards[1])
            return j_loop(IfThen(cond, (value,)))

        return fragments(element)

    body = Allocate(a_sh, (Allocate(b_sh, (Allocate(acc, (
        init, main, _warps(t, store_phase))),)),))
    return y_loop(x_loop(body))


def _warps(t: MmaTiles, body: Callable[[Expr, Expr], Stmt | list[Stmt]]) -> Stmt:
    """One phase: warps on ``threadIdx.y``, lanes on ``threadIdx.x``."""
    warp, warp_loop = loop("warp", t.warps_m * t.warps_n, LoopKind.THREAD_Y)
    lane, lane_loop = loop("lane", WARP, LoopKind.THREAD_X)
    return warp_loop(lane_loop(body(warp, lane)))


def _tile_load(t: MmaTiles, op: MmaOperand, dst: Buffer, base: Expr, tile: int, k0: Expr,
               words: int, tid: Expr, tag: str) -> Stmt:
    """Cooperative copy of ``tile`` rows x ``t.words`` words into ``dst[row][word]``."""
    w = vector_width(op.vec, t.words)
    per_row = t.words // w
    total = tile * per_row
    step, step_loop = loop(f"{tag}_l", ceil_div(total, t.threads), LoopKind.UNROLL)
    lane, lane_loop = loop(f"{tag}_v", w, LoopKind.VECTORIZE)
    lane_e: Expr = lane if w > 1 else Const(0)
    e = step * t.threads + tid
    row, col = e // per_row, (e % per_row) * w
    mn, k = base + row, k0 + col
    cond: Expr | None = None
    if op.rows % tile:
        cond = mn < op.rows
        mn = binop("min", mn, op.rows - 1)
    if words % t.words:
        cond = k < words if cond is None else binop("and", cond, k < words)
        k = binop("min", k, words - w)
    value = op.load(mn, k + lane_e)
    if cond is not None:
        value = Select(cond, value, Const(0, "int32"))
    copy: Stmt = store(dst[row, col + lane_e], value)
    if w > 1:
        copy = lane_loop(copy)
    if total % t.threads:
        copy = IfThen(e < total, (copy,))
    return step_loop(copy)
