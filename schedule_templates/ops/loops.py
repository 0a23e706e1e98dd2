"""Loop-nest building blocks shared by the generated operators' fixed schedules.

Every generated operator is the same shape of code: a few outer loops (the first one threaded
when there is enough work), then a walk along a contiguous axis as SIMD. The LLVM generator
fully unrolls a vectorized loop into pieces of at most 16 lanes, so a long contiguous axis is
split here into a serial loop over 16-lane chunks plus one vectorized remainder. Buffers are
declared flat and indexed with explicit offsets, which lets one nest serve broadcast inputs
(stride 0), sliced ones (stride * step) and permuted ones alike.

Before building a nest, ``collapse`` merges adjacent axes that every buffer walks alike (both
full, both broadcast), so a per-channel add over NCHW is (N, C, H*W), not four loops.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Sequence

from schedule_templates.ir.nodes import (
    Allocate,
    Buffer,
    Const,
    Expr,
    ExprLike,
    LoopKind,
    Scope,
    Stmt,
    as_expr,
    loop,
)

VECTOR = 16  # fp32 lanes of one AVX-512 register; the generator's widest vector piece
#: fewest output elements worth waking a second thread for
PARALLEL_MIN_WORK = 16 * 1024
#: a long contiguous axis is cut into blocks of this many elements to share it among threads
BLOCK = 1024
#: leading axes are fused into one threaded loop until it has at least this many iterations
PARALLEL_MIN_ITERS = 64

Offsets = tuple[Expr, ...]


@dataclasses.dataclass(frozen=True)
class Axis:
    """One loop of a nest: its extent and each buffer's element stride along it."""

    extent: int
    strides: tuple[int, ...]


def kernel_name(kind: str, key: str) -> str:
    return f"gen_{kind}_{hashlib.sha1(key.encode()).hexdigest()[:12]}"


def flat(name: str, shape: Sequence[int]) -> Buffer:
    """A kernel argument declared as one flat row-major run of ``prod(shape)`` floats."""
    return Buffer(name, (max(1, math.prod(shape)),))


def row_major(shape: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def collapse(axes: Sequence[Axis]) -> list[Axis]:
    """Drop extent-1 axes and merge each axis into the next where every buffer's stride says
    they are one contiguous run (outer stride = inner stride * inner extent, 0 and 0 included)."""
    out: list[Axis] = []
    for ax in axes:
        if ax.extent == 1:
            continue
        if out:
            prev = out[-1]
            if all(p == s * ax.extent for p, s in zip(prev.strides, ax.strides, strict=True)):
                out[-1] = Axis(prev.extent * ax.extent, ax.strides)
                continue
        out.append(ax)
    return out


def want_parallel(work: int, iterations: int) -> bool:
    return work >= PARALLEL_MIN_WORK and iterations >= 2


def split_long_inner(outer: list[Axis], inner: Axis
                     ) -> tuple[list[Axis], Axis, tuple[int, int] | None]:
    """If the outer loops are too few to share among threads and the inner axis is long, cut
    it into BLOCK-sized blocks (a new innermost outer axis). Returns the new outer axes, the
    inner axis, and (start, extent) of the tail the blocks leave over along it, if any."""
    if math.prod(a.extent for a in outer) >= PARALLEL_MIN_ITERS or inner.extent < 2 * BLOCK:
        return outer, inner, None
    blocks, tail = divmod(inner.extent, BLOCK)
    block_axis = Axis(blocks, tuple(s * BLOCK for s in inner.strides))
    return [*outer, block_axis], Axis(BLOCK, inner.strides), (
        (blocks * BLOCK, tail) if tail else None)


def nest(axes: Sequence[Axis], bases: Offsets, body: Callable[[Offsets], Sequence[Stmt]],
         parallel: bool, name: str = "i") -> list[Stmt]:
    """Loops over ``axes`` (outermost first) around ``body(offsets)``.

    With ``parallel``, leading axes are fused into one threaded loop (its indices recovered by
    division) until it has PARALLEL_MIN_ITERS iterations, so threads get even shares.
    """
    axes = list(axes)
    if not axes:
        return list(body(bases))
    if parallel:
        fused = 1
        count = 0
        while count < len(axes) and fused < PARALLEL_MIN_ITERS:
            fused *= axes[count].extent
            count += 1
        var, mk = loop(f"{name}p", fused, LoopKind.PARALLEL)
        fused_offsets = list(bases)
        below = fused
        for ax in axes[:count]:
            below //= ax.extent
            index = var // below if below > 1 else var
            if ax is not axes[0]:
                index = index % ax.extent
            fused_offsets = [o + index * s
                             for o, s in zip(fused_offsets, ax.strides, strict=True)]
        return [mk(nest(axes[count:], tuple(fused_offsets), body, False, name))]
    ax, rest = axes[0], axes[1:]
    var, mk = loop(f"{name}{len(rest)}", ax.extent)
    offsets = tuple(o + var * s for o, s in zip(bases, ax.strides, strict=True))
    return [mk(nest(rest, offsets, body, False, name))]


def vector_split(n: int, start: ExprLike, body: Callable[[Expr, Expr], Sequence[Stmt]],
                 name: str = "v", temps: Sequence[Buffer] = ()) -> list[Stmt]:
    """``body(index, lane)`` over ``index = start + 0 .. n-1`` as 16-lane SIMD chunks plus a
    vectorized remainder. ``lane`` (0..15) indexes the LOCAL ``temps`` buffers, allocated once
    around the whole walk (see ``local``)."""
    stmts: list[Stmt] = []
    chunks, rem = divmod(n, VECTOR)
    base = as_expr(start)
    if chunks:
        c, mk_c = loop(f"{name}c", chunks)
        v, mk_v = loop(f"{name}", VECTOR, LoopKind.VECTORIZE)
        stmts.append(mk_c(mk_v(body(base + c * VECTOR + v, v))))
    if rem:
        r, mk_r = loop(f"{name}r", rem, LoopKind.VECTORIZE if rem > 1 else LoopKind.SERIAL)
        stmts.append(mk_r(body(base + chunks * VECTOR + r, r)))
    for buf in temps:
        stmts = [Allocate(buf, tuple(stmts))]
    return stmts


def local(name: str, lanes: int = VECTOR) -> Buffer:
    """A per-thread scratch buffer (registers after LLVM's promotion)."""
    return Buffer(name, (lanes,), Scope.LOCAL)


def tree(values: Sequence[Expr], combine: Callable[[Expr, Expr], Expr]) -> Expr:
    """Combine values as a balanced tree (short dependency chains, exact for max)."""
    items = list(values)
    while len(items) > 1:
        pairs = [combine(items[i], items[i + 1]) for i in range(0, len(items) - 1, 2)]
        items = pairs + ([items[-1]] if len(items) % 2 else [])
    return items[0]


def fconst(value: float) -> Expr:
    return Const(float(value), "float32")
