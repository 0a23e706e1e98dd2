"""Pieces the CUDA templates share: device limits, and a shared-memory tiled SIMT GEMM.

The GEMM is the classic fp32 design (CUTLASS's SIMT kernels, AutoTVM's cuda dense):
a block computes a ``BM x BN`` tile of the output with ``TY x TX`` threads, each holding an
``MR x NR`` register tile. For every ``BK`` slice of the reduction the block loads both operand
tiles cooperatively into shared memory (vector loads where the layout allows), synchronizes,
and every thread runs ``BK`` rank-1 updates of its register tile from register fragments read
out of shared memory (``float4`` reads when a fragment's ``vec`` lanes are adjacent). Fragment
lanes are interleaved across threads (``vec`` adjacent values per thread, then the next thread)
so that global stores coalesce and shared reads avoid bank conflicts. Shared tiles are stored
``[k][m]`` with an optional pad that breaks bank conflicts of the transposing stores.
Tiles need not divide the problem: out-of-range operands read clamped addresses and are
zeroed, out-of-range outputs are not stored.
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
from schedule_templates.space import AnnotateKnob, ChoiceKnob, Config, ConfigSpace

#: static shared memory a kernel may declare without opting in to more
STATIC_SHARED_BYTES = 49152
#: grid y/z dimensions are limited to this many blocks
MAX_GRID_YZ = 65535
#: registers a thread needs beyond its tiles (indices, pointers, loop counters)
REGISTER_OVERHEAD = 24


@dataclasses.dataclass(frozen=True)
class DeviceLimits:
    """What a worker reported about its GPU (the defaults fit every GPU since Volta)."""

    max_threads_per_block: int = 1024
    max_shared_memory_per_block: int = 49152
    max_registers_per_block: int = 65536
    max_registers_per_thread: int = 255
    warp_size: int = 32
    compute_capability: str = "sm_90"
    multiprocessor_count: int = 132

    @classmethod
    def from_device(cls, device: Mapping[str, Any] | None) -> DeviceLimits:
        """Known keys of a worker's report; anything missing or malformed keeps its default."""
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            value = (device or {}).get(field.name)
            if field.type in ("int", int):
                usable = isinstance(value, int) and not isinstance(value, bool) and value > 0
            else:
                usable = isinstance(value, str) and bool(value)
            if usable:
                values[field.name] = value
        return cls(**values)

    @property
    def shared_bytes(self) -> int:
        return min(self.max_shared_memory_per_block, STATIC_SHARED_BYTES)

    def fits(self, threads: int, shared_bytes: int, registers_per_thread: int) -> bool:
        """Whether a block of ``threads`` threads can be launched on this device at all."""
        return (threads % self.warp_size == 0
                and threads <= self.max_threads_per_block
                and shared_bytes <= self.shared_bytes
                and registers_per_thread <= self.max_registers_per_thread
                and registers_per_thread * threads <= self.max_registers_per_block)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def tile_cap(extent: int) -> int:
    """The largest block tile along an axis of ``extent``: at most twice the (power-of-two
    rounded) extent, so small problems do not launch mostly idle threads."""
    return max(8, 1 << max(0, extent - 1).bit_length())


def vector_width(*extents: int) -> int:
    """The widest of 4, 2, 1 that divides every extent (a vector never straddles a row)."""
    return next(w for w in (4, 2, 1) if all(e % w == 0 for e in extents))


# -- the GEMM space ----------------------------------------------------------------------------

THREADS = (1, 2, 4, 8, 16, 32)
REGS = (1, 2, 4, 8)
TILE_K = (4, 8, 16, 32)


def gemm_knobs() -> tuple[Any, ...]:
    return (
        ChoiceKnob("threads_m", THREADS),
        ChoiceKnob("regs_m", REGS),
        ChoiceKnob("threads_n", THREADS),
        ChoiceKnob("regs_n", REGS),
        ChoiceKnob("tile_k", TILE_K),
        ChoiceKnob("vec_m", (1, 2, 4)),
        ChoiceKnob("vec_n", (1, 2, 4)),
        ChoiceKnob("shared_pad", (0, 4)),
        AnnotateKnob("unroll_k", ("none", "unroll")),
    )


@dataclasses.dataclass(frozen=True)
class GemmTiles:
    ty: int
    mr: int
    tx: int
    nr: int
    bk: int
    vm: int
    vn: int
    pad: int
    unroll_k: bool

    @classmethod
    def of(cls, cfg: Config) -> GemmTiles:
        return cls(cfg["threads_m"], cfg["regs_m"], cfg["threads_n"], cfg["regs_n"],
                   cfg["tile_k"], cfg["vec_m"], cfg["vec_n"], cfg["shared_pad"],
                   cfg["unroll_k"] == "unroll")

    @property
    def bm(self) -> int:
        return self.ty * self.mr

    @property
    def bn(self) -> int:
        return self.tx * self.nr

    @property
    def threads(self) -> int:
        return self.tx * self.ty

    @property
    def shared_bytes(self) -> int:
        return 4 * self.bk * (self.bm + self.pad + self.bn + self.pad)

    @property
    def registers(self) -> int:
        """Accumulators, both fragments, staging of two vector loads, and overhead."""
        return self.mr * self.nr + self.mr + self.nr + 8 + REGISTER_OVERHEAD


def gemm_space(batch: int, M: int, N: int, K: int, device: Mapping[str, Any] | None
               ) -> ConfigSpace:
    limits = DeviceLimits.from_device(device)

    def valid(cfg: Config) -> bool:
        t = GemmTiles.of(cfg)
        return (t.mr % t.vm == 0 and t.nr % t.vn == 0
                and t.bm <= tile_cap(M) and t.bn <= tile_cap(N) and t.bk <= tile_cap(K)
                and ceil_div(M, t.bm) <= MAX_GRID_YZ and batch <= MAX_GRID_YZ
                and limits.fits(t.threads, t.shared_bytes, t.registers))

    return ConfigSpace(gemm_knobs(), constraint=valid)


#: register tiles, thread shapes and reduction slices the default config tries, best first
_DEFAULT_REGS = ((8, 8), (4, 8), (8, 4), (4, 4), (2, 4), (4, 2), (2, 2), (1, 4), (4, 1),
                 (1, 2), (2, 1), (1, 1))
_DEFAULT_THREADS = ((16, 16), (8, 16), (16, 8), (8, 8), (4, 16), (16, 4), (4, 8), (8, 4),
                    (2, 16), (16, 2), (1, 32), (32, 1), (2, 32), (32, 2), (1, 64))


def gemm_default(space: ConfigSpace, enough: Callable[[GemmTiles], bool] | None = None
                 ) -> Config:
    """The first valid of the classic shapes (128x128 tiles of 8x8 per thread when they fit);
    with ``enough``, the first that also satisfies it (say, launches enough blocks to fill the
    GPU), else the first valid one."""
    first: Config | None = None
    for mr, nr in _DEFAULT_REGS:
        for ty, tx in _DEFAULT_THREADS:
            if ty not in THREADS or tx not in THREADS:
                continue
            for bk in (8, 16, 4, 32):
                cfg = space.from_entities({
                    "threads_m": ty, "regs_m": mr, "threads_n": tx, "regs_n": nr,
                    "tile_k": bk, "vec_m": min(4, mr), "vec_n": min(4, nr),
                    "shared_pad": 4, "unroll_k": "unroll"})
                if not space.is_valid(cfg.index):
                    continue
                if enough is None or enough(GemmTiles.of(cfg)):
                    return cfg
                first = first or cfg
    if first is None:
        raise ValueError("no valid GEMM config")  # unreachable: 8x4 threads of 1x1 always fit
    return first


#: the convolution default where the classic tile leaves multiprocessors idle: 64x16 blocks of
#: 16x8 threads holding 4x2 each. On an H200 (docs/cuda.md) it won three of ResNet-18's 3x3
#: layers outright and ran them 3-4x faster than the 128x128 default (C=64 at 56x56: 6.7 vs
#: 1.6 TFLOPS; C=256 at 14x14: 1.8 vs 0.5; C=512 at 7x7: 0.9 vs 0.3)
SMALL_GRID_TILES = {"threads_m": 16, "regs_m": 4, "threads_n": 8, "regs_n": 2, "tile_k": 16,
                    "vec_m": 4, "vec_n": 2, "shared_pad": 0, "unroll_k": "unroll"}


def small_grid_default(space: ConfigSpace, M: int, N: int) -> Config:
    """``gemm_default``, unless its grid leaves over half the multiprocessors of a GPU of
    ``DeviceLimits`` without a block (the measured layers had 4-25 blocks; ResNet's stem, 98
    blocks of 64x128, ran at 0.6 of tuned and keeps them): then ``SMALL_GRID_TILES``
    where valid."""
    classic = gemm_default(space)
    tiles = GemmTiles.of(classic)
    blocks = ceil_div(M, tiles.bm) * ceil_div(N, tiles.bn)
    if 2 * blocks >= DeviceLimits().multiprocessor_count:
        return classic
    small = space.from_entities(SMALL_GRID_TILES)
    return small if space.is_valid(small.index) else classic


# -- the GEMM loop nest ------------------------------------------------------------------------

#: (batch, mn, k) -> value, with mn and k already in range
LoadFn = Callable[[Expr, Expr, Expr], Expr]


@dataclasses.dataclass(frozen=True)
class Operand:
    """One input of ``C[m, n] = sum_k A[m, k] B[k, n]`` as the loads see it.

    ``contiguous`` names the axis along which consecutive elements are adjacent in memory:
    ``"k"`` (the tile is transposed on its way to shared memory) or ``"mn"``. ``vec`` is the
    widest vector the layout allows along that axis (it must divide that axis's extent);
    ``load`` must be affine in the contiguous index for vector loads to happen."""

    extent: int
    contiguous: str
    vec: int
    load: LoadFn


#: (batch, m, n) -> the output element to store
StoreFn = Callable[[Expr, Expr, Expr], Load]
#: (accumulator, batch, m, n) -> the value stored (an epilogue, or the accumulator itself)
FinishFn = Callable[[Expr, Expr, Expr, Expr], Expr]
#: (accumulator, a, b) -> the accumulator after one step of the reduction
MaddFn = Callable[[Expr, Expr, Expr], Expr]


def fma(acc: Expr, a: Expr, b: Expr) -> Expr:
    """The fp32 step: ``a * b + acc`` (nvcc contracts it into one FMA)."""
    return a * b + acc


@dataclasses.dataclass(frozen=True)
class GemmProblem:
    batch: int
    M: int
    N: int
    K: int
    a: Operand
    b: Operand
    out: StoreFn
    finish: FinishFn
    #: element type of the operand tiles and the accumulators; an int8 GEMM runs on int32
    #: words of four bytes (the reduction ``K`` counts words) with ``madd`` a dp4a
    dtype: str = "float32"
    madd: MaddFn = fma

    @property
    def zero(self) -> Const:
        return Const(0.0, "float32") if self.dtype == "float32" else Const(0, self.dtype)


def gemm_nest(t: GemmTiles, p: GemmProblem) -> Stmt:
    zero = p.zero
    bz: Expr = Const(0)
    z_loop: Callable[..., Stmt] = _no_loop
    if p.batch > 1:
        bz, z_loop = loop("b", p.batch, LoopKind.BLOCK_Z)
    by, y_loop = loop("bm", ceil_div(p.M, t.bm), LoopKind.BLOCK_Y)
    bx, x_loop = loop("bn", ceil_div(p.N, t.bn), LoopKind.BLOCK_X)
    a_sh = Buffer("A_shared", (t.bk, t.bm + t.pad), Scope.SHARED, p.dtype)
    b_sh = Buffer("B_shared", (t.bk, t.bn + t.pad), Scope.SHARED, p.dtype)
    acc = Buffer("acc", (t.mr, t.nr), Scope.LOCAL, p.dtype)
    m0, n0 = by * t.bm, bx * t.bn

    i, i_loop = loop("i", t.mr, LoopKind.UNROLL)
    j, j_loop = loop("j", t.nr, LoopKind.UNROLL)
    init = _threads(t, lambda _ty, _tx, _tid: i_loop(j_loop(store(acc[i, j], zero))))

    ko, k_outer = loop("k_o", ceil_div(p.K, t.bk))
    k0 = ko * t.bk

    def load_phase(_ty: Expr, _tx: Expr, tid: Expr) -> list[Stmt]:
        return [*_tile_load(t, p, p.a, a_sh, bz, m0, t.bm, k0, tid, "a"),
                *_tile_load(t, p, p.b, b_sh, bz, n0, t.bn, k0, tid, "b")]

    compute = _threads(t, lambda ty, tx, _tid: _compute(t, p, a_sh, b_sh, acc, ty, tx))
    main = k_outer(_threads(t, load_phase), Barrier(), compute, Barrier())
    store_phase = _threads(t, lambda ty, tx, _tid: _store_tile(t, p, acc, bz, m0, n0, ty, tx))
    body = Allocate(a_sh, (Allocate(b_sh, (Allocate(acc, (init, main, store_phase)),)),))
    return z_loop(y_loop(x_loop(body)))


def _threads(t: GemmTiles, body: Callable[[Expr, Expr, Expr], Stmt | list[Stmt]]) -> Stmt:
    """One phase: a fresh pair of thread loops around ``body(ty, tx, flat thread id)``."""
    ty, ty_loop = loop("ty", t.ty, LoopKind.THREAD_Y)
    tx, tx_loop = loop("tx", t.tx, LoopKind.THREAD_X)
    return ty_loop(tx_loop(body(ty, tx, ty * t.tx + tx)))


def _tile_load(t: GemmTiles, p: GemmProblem, op: Operand, dst: Buffer, bz: Expr, base: Expr,
               tile: int, k0: Expr, tid: Expr, tag: str) -> list[Stmt]:
    """Cooperative copy of a ``tile x BK`` operand slice into ``dst[k][mn]``."""
    along_k = op.contiguous == "k"
    w = vector_width(op.vec, t.bk if along_k else tile)
    per_row = (t.bk if along_k else tile) // w
    total = (tile if along_k else t.bk) * per_row
    rounds = ceil_div(total, t.threads)
    guard_mn, guard_k = op.extent % tile != 0, p.K % t.bk != 0
    lane, lane_loop = loop(f"{tag}_v", w, LoopKind.VECTORIZE)
    lane_e: Expr = lane if w > 1 else Const(0)
    step, step_loop = loop(f"{tag}_l", rounds, LoopKind.UNROLL)
    e = step * t.threads + tid
    if along_k:
        row, col = e // per_row, (e % per_row) * w
        mn, k, target = base + row, k0 + col, dst[col + lane_e, row]
    else:
        row, col = e // per_row, (e % per_row) * w
        mn, k, target = base + col, k0 + row, dst[row, col + lane_e]
    cond: Expr | None = None
    if guard_mn:
        cond = mn < op.extent
        mn = binop("min", mn, op.extent - (1 if along_k else w))
    if guard_k:
        cond = _and(cond, k < p.K)
        k = binop("min", k, p.K - (w if along_k else 1))
    value = op.load(bz, mn, k + lane_e) if along_k else op.load(bz, mn + lane_e, k)
    if cond is not None:
        value = Select(cond, value, p.zero)
    copy: Stmt = store(target, value)
    if w > 1:
        copy = lane_loop(copy)
    if total % t.threads != 0:
        copy = IfThen(e < total, (copy,))
    return [step_loop(copy)]


def _compute(t: GemmTiles, p: GemmProblem, a_sh: Buffer, b_sh: Buffer, acc: Buffer, ty: Expr,
             tx: Expr) -> Stmt:
    a_frag = Buffer("a_frag", (t.mr,), Scope.LOCAL, p.dtype)
    b_frag = Buffer("b_frag", (t.nr,), Scope.LOCAL, p.dtype)
    kk, kk_loop = loop("k_i", t.bk, LoopKind.UNROLL if t.unroll_k else LoopKind.SERIAL)
    i, i_loop = loop("i", t.mr, LoopKind.UNROLL)
    j, j_loop = loop("j", t.nr, LoopKind.UNROLL)
    return Allocate(a_frag, (Allocate(b_frag, (kk_loop(
        _fragment(a_frag, a_sh, kk, ty, t.ty, t.mr, t.vm, "a"),
        _fragment(b_frag, b_sh, kk, tx, t.tx, t.nr, t.vn, "b"),
        i_loop(j_loop(store(acc[i, j], p.madd(acc[i, j], a_frag[i], b_frag[j])))),
    ),)),))


def _fragment(frag: Buffer, src: Buffer, kk: Expr, thread: Expr, threads: int, regs: int,
              vec: int, tag: str) -> Stmt:
    """Register ``c*vec + v`` holds tile row ``c*threads*vec + thread*vec + v``."""
    c, c_loop = loop(f"{tag}_c", regs // vec, LoopKind.UNROLL)
    v, v_loop = loop(f"{tag}_f", vec, LoopKind.VECTORIZE if vec > 1 else LoopKind.UNROLL)
    return c_loop(v_loop(store(frag[c * vec + v], src[kk, (c * threads + thread) * vec + v])))


def _store_tile(t: GemmTiles, p: GemmProblem, acc: Buffer, bz: Expr, m0: Expr, n0: Expr,
                ty: Expr, tx: Expr) -> Stmt:
    ci, ci_loop = loop("i_c", t.mr // t.vm, LoopKind.UNROLL)
    vi, vi_loop = loop("i_v", t.vm, LoopKind.UNROLL)
    cj, cj_loop = loop("j_c", t.nr // t.vn, LoopKind.UNROLL)
    chunk_guard = p.N % t.vn == 0  # a vector of outputs is wholly inside or wholly outside
    lane_kind = LoopKind.VECTORIZE if t.vn > 1 and chunk_guard else LoopKind.UNROLL
    vj, vj_loop = loop("j_v", t.vn, lane_kind)
    m = m0 + (ci * t.ty + ty) * t.vm + vi
    n_base = n0 + (cj * t.tx + tx) * t.vn
    n = n_base + vj
    value = p.finish(acc[ci * t.vm + vi, cj * t.vn + vj], bz, m, n)
    element: Stmt = store(p.out(bz, m, n), value)
    row_cond = m < p.M if p.M % t.bm else None
    if p.N % t.bn == 0:
        inner = vj_loop(element)
    elif chunk_guard:
        inner = IfThen(n_base < p.N, (vj_loop(element),))
    else:
        inner = vj_loop(IfThen(n < p.N, (element,)))
    row = cj_loop(inner)
    if row_cond is not None:
        row = IfThen(row_cond, (row,))
    return ci_loop(vi_loop(row))


def _no_loop(*body: Stmt) -> Stmt:
    (only,) = body
    return only


def _and(a: Expr | None, b: Expr) -> Expr:
    return b if a is None else binop("and", a, b)
