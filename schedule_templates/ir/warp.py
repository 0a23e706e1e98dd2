"""Warp-wide statements: GPU instructions that a whole warp executes together (the tensor
cores), whose operands are spread over the lanes. Each has an ``expand()`` into ordinary nodes
that computes, lane by lane, what the instruction leaves in that lane's registers: the form every
pass that does not know the statement runs (``ir/visitor.py``), and what makes the serial host
run of a GPU kernel (``ir/gpu.py``) exact.
"""

from __future__ import annotations

import dataclasses

from schedule_templates.ir.nodes import Expr, Load, LoopKind, Stmt, Store, intrinsic, loop

#: one warp-wide tensor-core step: rows x columns x bytes of the reduction
MMA_ROWS, MMA_COLS, MMA_WORDS = 16, 8, 8


@dataclasses.dataclass(frozen=True, eq=False)
class WarpMma(Stmt):
    """One warp's ``mma.sync.aligned.m16n8k32`` (u8 x s8 -> s32) on tiles in shared memory,
    executed by every lane of the warp (the statement stands inside the thread loops).

    ``a`` is the word (first row, first word) of a 16-row x 8-word (32-byte) tile of int32
    words, four unsigned bytes each, rows along the buffer's first axis; ``b`` likewise for an
    8-column tile of signed bytes stored one row per output column (the ``.col`` operand).
    ``acc`` is the first of four consecutive int32 accumulators of this lane along the last
    axis of a LOCAL buffer. Lane ``l`` (``lane``, 0..31) owns rows ``l // 4`` and ``l // 4 + 8``
    and columns ``2 * (l % 4)`` and ``+ 1`` of the 16 x 8 result: accumulator ``i`` is row
    ``l // 4 + 8 * (i // 2)``, column ``2 * (l % 4) + i % 2`` (PTX's fragment layout).

    ``expand`` gives the same arithmetic per lane in ordinary IR (``dp4a`` over the 8 words
    of that row and column, read straight from shared memory): what passes that do not know
    the node (the host form of a GPU kernel, the LLVM generator) run instead. The CUDA
    generator emits the instruction itself, loading the lane's fragments as the layout says."""

    acc: Load
    a: Load
    b: Load
    lane: Expr

    def accumulator(self, i: int) -> Load:
        *lead, last = self.acc.indices
        return Load(self.acc.buffer, (*lead, last + i))

    def position(self, i: int) -> tuple[Expr, Expr]:
        """(row of ``a``, row of ``b``) that accumulator ``i`` of this lane belongs to."""
        group, pair = self.lane // 4, self.lane % 4
        return (self.a.indices[0] + group + 8 * (i // 2),
                self.b.indices[0] + pair * 2 + i % 2)

    def expand(self) -> Stmt:
        steps: list[Stmt] = []
        for i in range(4):
            row, col = self.position(i)
            value: Expr = self.accumulator(i)
            for w in range(MMA_WORDS):
                value = intrinsic("dp4a", value, Load(self.a.buffer, (row, self.a.indices[1] + w)),
                                  Load(self.b.buffer, (col, self.b.indices[1] + w)))
            target = self.accumulator(i)
            steps.append(Store(target.buffer, target.indices, value))
        _, block = loop("mma", 1, LoopKind.UNROLL)  # one statement holding the four
        return block(*steps)
