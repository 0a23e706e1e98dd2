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

from schedule_templates.errors import CodegenError
from schedule_templates.ir.nodes import (
    Allocate,
    Barrier,
    Buffer,
    Const,
    Expr,
    Kernel,
    Load,
    Loop,
    LoopKind,
    Scope,
    Stmt,
    Store,
    Var,
)
from schedule_templates.ir.visitor import StmtMutator, StmtVisitor
from schedule_templates.ir.warp import WarpMma

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
    checker = _PlacementCheck()
    checker.visit_body(kernel.body)
    grid = tuple(checker.extents.get(k, 1) for k in BLOCK_KINDS)
    block = tuple(checker.extents.get(k, 1) for k in THREAD_KINDS)
    return LaunchDims(grid, block)  # type: ignore[arg-type]


class _PlacementCheck(StmtVisitor):
    """Checks the placement rules and records each GPU kind's largest extent."""

    def __init__(self) -> None:
        self.bound: frozenset[LoopKind] = frozenset()
        self.extents: dict[LoopKind, int] = {}

    def visit_expr(self, e: Expr) -> None:
        return None  # placement is about statements only

    def _in_thread(self) -> bool:
        return any(k in THREAD_KINDS for k in self.bound)

    def visit_barrier(self, s: Barrier) -> None:
        if self._in_thread():
            raise CodegenError("a barrier inside a thread loop would deadlock; end the phase")

    def visit_loop(self, s: Loop) -> None:
        if s.kind not in BLOCK_KINDS and s.kind not in THREAD_KINDS:
            self.visit_body(s.body)
            return
        if s.kind in self.bound:
            raise CodegenError(f"loop {s.var.name} binds {s.kind.value} twice")
        if s.kind in BLOCK_KINDS and self._in_thread():
            raise CodegenError(f"block loop {s.var.name} is inside a thread loop")
        self.extents[s.kind] = max(self.extents.get(s.kind, 1), s.extent)
        outer = self.bound
        self.bound = outer | {s.kind}
        self.visit_body(s.body)
        self.bound = outer


# -- serial form for the host ------------------------------------------------------------------


def serialize_for_host(kernel: Kernel) -> Kernel:
    """The same kernel with barriers dropped and thread-private buffers given a leading
    ``[threadIdx.z][threadIdx.y][threadIdx.x]`` index, so that GPU loops may run serially."""
    body = _Serializer(launch_dims(kernel)).visit_body(kernel.body)
    return Kernel(kernel.name, kernel.params, kernel.workspace, body)


class _Serializer(StmtMutator):
    def __init__(self, dims: LaunchDims) -> None:
        self.dims = dims
        self.private: dict[Buffer, Buffer] = {}
        self.threads: dict[LoopKind, Var] = {}  # the thread loops around the current node

    def visit_body(self, body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
        if any(type(s) is Barrier for s in body):
            body = tuple(s for s in body if type(s) is not Barrier)
        return super().visit_body(body)

    def visit_loop(self, s: Loop) -> Stmt:
        if s.kind not in THREAD_KINDS:
            return super().visit_loop(s)
        outer = self.threads
        self.threads = {**outer, s.kind: s.var}
        try:
            return super().visit_loop(s)
        finally:
            self.threads = outer

    def visit_allocate(self, s: Allocate) -> Stmt:
        buf = s.buffer
        if buf.scope is not Scope.LOCAL or self.threads:
            return super().visit_allocate(s)
        wide = Buffer(buf.name, (*reversed(self.dims.block), *buf.shape), buf.scope, buf.dtype,
                      buf.slack)
        self.private[buf] = wide
        return Allocate(wide, self.visit_body(s.body))

    def visit_warp_mma(self, s: WarpMma) -> Stmt:
        """A warp-wide instruction has no serial meaning: each lane's share of it, from the
        shared-memory tiles, is what the lane computes in turn."""
        return self.visit_stmt(s.expand())

    def visit_store(self, s: Store) -> Stmt:
        if s.buffer not in self.private:
            return super().visit_store(s)
        target = self.visit_load(Load(s.buffer, s.indices))
        assert isinstance(target, Load)
        return Store(target.buffer, target.indices, self.visit_expr(s.value))

    def visit_load(self, e: Load) -> Expr:
        if e.buffer not in self.private:
            return super().visit_load(e)
        if not self.threads:
            raise CodegenError(
                f"thread-private buffer {e.buffer.name} is used outside thread loops")
        lead = tuple(self.threads.get(k, Const(0)) for k in reversed(THREAD_KINDS))
        return Load(self.private[e.buffer], (*lead, *self.visit_exprs(e.indices)))
