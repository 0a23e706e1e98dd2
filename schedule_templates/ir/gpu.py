"""GPU structure of a loop nest: launch dimensions, placement rules, and a serial host form.

A GPU kernel in this IR is a nest whose outer loops are bound to ``blockIdx`` and whose phases
are thread-loop nests (``threadIdx``) separated by ``Barrier``s. The rules, checked here:
- a block loop is never inside a thread loop, and no GPU kind is nested inside itself;
- a barrier is never inside a thread loop (every phase between barriers has its own thread
  loops: the same ``threadIdx`` bound again);
- a LOCAL buffer allocated outside the thread loops is *thread-private* (one copy per thread,
  registers on the GPU) and is only touched inside thread loops.

Under these rules a block can run serially: each phase's thread loops run one thread after the
other, and finishing a phase is the barrier. ``serialize_for_host`` gives each thread-private
buffer a leading thread index, so the LLVM generator (which runs GPU loops as serial loops)
executes the very same kernel on the CPU: the strongest check of a GPU template without a GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from schedule_templates.errors import CodegenError
from schedule_templates.ir.nodes import (
    Allocate,
    Barrier,
    BinOp,
    Buffer,
    Call,
    Const,
    Expr,
    IfThen,
    Kernel,
    Load,
    Loop,
    LoopKind,
    Scope,
    Select,
    Stmt,
    Store,
    Var,
)

BLOCK_KINDS = (LoopKind.BLOCK_X, LoopKind.BLOCK_Y, LoopKind.BLOCK_Z)
THREAD_KINDS = (LoopKind.THREAD_X, LoopKind.THREAD_Y, LoopKind.THREAD_Z)


@dataclasses.dataclass(frozen=True)
class LaunchDims:
    """Grid and block sizes (x, y, z) implied by the bound loops (1 where a kind is unused)."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def extent(self, kind: LoopKind) -> int:
        if kind in BLOCK_KINDS:
            return self.grid[BLOCK_KINDS.index(kind)]
        return self.block[THREAD_KINDS.index(kind)]


def launch_dims(kernel: Kernel) -> LaunchDims:
    """The launch shape: each GPU kind's largest loop extent (smaller loops are guarded).
    Raises CodegenError when the nest breaks the placement rules above."""
    extents: dict[LoopKind, int] = {}
    _check(kernel.body, frozenset(), extents)
    grid = tuple(extents.get(k, 1) for k in BLOCK_KINDS)
    block = tuple(extents.get(k, 1) for k in THREAD_KINDS)
    return LaunchDims(grid, block)  # type: ignore[arg-type]


def _check(body: tuple[Stmt, ...], bound: frozenset[LoopKind],
           extents: dict[LoopKind, int]) -> None:
    in_thread = any(k in THREAD_KINDS for k in bound)
    for s in body:
        if isinstance(s, Barrier) and in_thread:
            raise CodegenError("a barrier inside a thread loop would deadlock; end the phase")
        if isinstance(s, Loop) and s.kind in (*BLOCK_KINDS, *THREAD_KINDS):
            if s.kind in bound:
                raise CodegenError(f"loop {s.var.name} binds {s.kind.value} twice")
            if s.kind in BLOCK_KINDS and in_thread:
                raise CodegenError(f"block loop {s.var.name} is inside a thread loop")
            extents[s.kind] = max(extents.get(s.kind, 1), s.extent)
            _check(s.body, bound | {s.kind}, extents)
        elif isinstance(s, Loop | Allocate | IfThen):
            _check(s.body, bound, extents)


# -- serial form for the host ------------------------------------------------------------------


def map_expr(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Rebuild ``e`` bottom-up; ``fn`` may replace a node (returning None keeps it)."""
    replaced = fn(e)
    if replaced is not None:
        return replaced
    if isinstance(e, BinOp):
        return BinOp(e.op, map_expr(e.a, fn), map_expr(e.b, fn))
    if isinstance(e, Select):
        return Select(map_expr(e.cond, fn), map_expr(e.a, fn), map_expr(e.b, fn))
    if isinstance(e, Call):
        return Call(e.fn, map_expr(e.arg, fn))
    if isinstance(e, Load):
        return Load(e.buffer, tuple(map_expr(i, fn) for i in e.indices))
    return e


def serialize_for_host(kernel: Kernel) -> Kernel:
    """The same kernel with barriers dropped and thread-private buffers given a leading
    ``[threadIdx.z][threadIdx.y][threadIdx.x]`` index, so that GPU loops may run serially."""
    dims = launch_dims(kernel)
    rewriter = _Serializer(dims)
    body = rewriter.body(kernel.body, {}, inside_thread=False)
    return Kernel(kernel.name, kernel.params, kernel.workspace, body)


class _Serializer:
    def __init__(self, dims: LaunchDims) -> None:
        self.dims = dims
        self.private: dict[Buffer, Buffer] = {}

    def body(self, body: tuple[Stmt, ...], threads: dict[LoopKind, Var],
             inside_thread: bool) -> tuple[Stmt, ...]:
        out: list[Stmt] = []
        for s in body:
            if isinstance(s, Barrier):
                continue
            out.append(self.stmt(s, threads, inside_thread))
        return tuple(out)

    def stmt(self, s: Stmt, threads: dict[LoopKind, Var], inside_thread: bool) -> Stmt:
        if isinstance(s, Loop):
            if s.kind in THREAD_KINDS:
                inner = {**threads, s.kind: s.var}
                return Loop(s.var, s.extent, s.kind, self.body(s.body, inner, True))
            return Loop(s.var, s.extent, s.kind, self.body(s.body, threads, inside_thread))
        if isinstance(s, Allocate):
            buf = s.buffer
            if buf.scope is Scope.LOCAL and not inside_thread:
                wide = Buffer(buf.name, (*reversed(self.dims.block), *buf.shape), buf.scope,
                              buf.dtype, buf.slack)
                self.private[buf] = wide
                buf = wide
            return Allocate(buf, self.body(s.body, threads, inside_thread))
        if isinstance(s, IfThen):
            return IfThen(self.expr(s.cond, threads, inside_thread),
                          self.body(s.body, threads, inside_thread))
        if isinstance(s, Store):
            target = self.expr(Load(s.buffer, s.indices), threads, inside_thread)
            assert isinstance(target, Load)
            return Store(target.buffer, target.indices,
                         self.expr(s.value, threads, inside_thread))
        raise CodegenError(f"cannot serialize {type(s).__name__}")

    def expr(self, e: Expr, threads: dict[LoopKind, Var], inside_thread: bool) -> Expr:
        def widen(node: Expr) -> Expr | None:
            if not isinstance(node, Load) or node.buffer not in self.private:
                return None
            if not inside_thread:
                raise CodegenError(
                    f"thread-private buffer {node.buffer.name} is used outside thread loops")
            lead = tuple(threads.get(k, Const(0)) for k in reversed(THREAD_KINDS))
            rest = tuple(map_expr(i, widen) for i in node.indices)
            return Load(self.private[node.buffer], (*lead, *rest))

        return map_expr(e, widen)
