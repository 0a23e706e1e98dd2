"""Stages the x86 int8 templates run around their dot-product nest.

- ``word_rows``: rows of u8 values packed into the 32-bit words the nest broadcasts or loads
  (4 bytes per word for VNNI, two values widened to 16 bits for ``vpmaddwd``), K padded with
  zeros to whole groups;
- ``copy_rows``: the real columns of a workspace computed with padded columns, copied out;
- ``vector_walk``: one row's elements as 16-lane pieces and a vectorized remainder.

Both run in parallel over rows, with serial inner loops that LLVM vectorizes itself.
"""

from __future__ import annotations

from collections.abc import Callable

from schedule_templates.ir.nodes import (
    Buffer,
    Const,
    Expr,
    Load,
    LoopKind,
    Stmt,
    as_expr,
    loop,
    store,
)
from schedule_templates.templates.choose import LANES
from schedule_templates.templates.x86_dot_gemm import DotInstruction

#: (row, k) -> the int32 value (0..255) of the u8 element there
ByteSource = Callable[[Expr, Expr], Expr]
#: (row, column) -> the element a stage stores to
Target = Callable[[Expr, Expr], Load]


def word_rows(target: Target, source: ByteSource, rows: int, K: int,
              words: int, inst: DotInstruction, prefix: str = "w") -> Stmt:
    """For every row: ``words`` words of ``inst.per_word`` consecutive values each (little
    end first), the values past K zero."""
    per = inst.per_word
    bits = 32 // per
    row, rows_loop = loop(f"{prefix}_m", rows, LoopKind.PARALLEL)

    def pack(first: Expr, count: int) -> Expr:
        word: Expr = source(row, first)
        for i in range(1, count):  # wrapping int32 arithmetic: the top byte may set the sign
            word = word + source(row, first + i) * Const(1 << (bits * i), "int32")
        return word

    full = K // per
    body: list[Stmt] = []
    if full:
        w, words_loop = loop(f"{prefix}_w", full)
        body.append(words_loop(store(target(row, w), pack(w * per, per))))
    if K % per:
        body.append(store(target(row, as_expr(full)), pack(as_expr(full * per), K % per)))
    used = -(-K // per)
    if words > used:
        z, zeros_loop = loop(f"{prefix}_z", words - used)
        body.append(zeros_loop(store(target(row, z + used), Const(0, "int32"))))
    return rows_loop(*body)


def copy_rows(source: Buffer | Callable[[Expr, Expr], Expr], target: Target, rows: int,
              columns: int, prefix: str = "c") -> Stmt:
    """``target(row, n) = source(row, n)`` for the first ``columns`` columns of every row (a
    Buffer source is read as ``source[row, n]``; a function may compute on what it loads)."""
    if isinstance(source, Buffer):
        buffer = source

        def source(row: Expr, n: Expr) -> Expr:
            return buffer[row, n]

    row, rows_loop = loop(f"{prefix}_m", rows, LoopKind.PARALLEL)
    return rows_loop(*vector_walk(columns, lambda n: store(target(row, n), source(row, n)),
                                  prefix))


def vector_walk(columns: int, element: Callable[[Expr], Stmt], prefix: str = "v",
                start: int = 0) -> list[Stmt]:
    """``element(n)`` for n in start..start+columns-1: LANES-wide vectorized pieces, then the
    rest."""
    body: list[Stmt] = []
    blocks, rest = divmod(max(0, columns), LANES)
    if blocks:
        cb, blocks_loop = loop(f"{prefix}_b", blocks)
        cj, lanes_loop = loop(f"{prefix}_j", LANES, LoopKind.VECTORIZE)
        body.append(blocks_loop(lanes_loop(element(cb * LANES + cj + start))))
    if rest:
        cr, rest_loop = loop(f"{prefix}_r", rest, LoopKind.VECTORIZE if rest > 1
                             else LoopKind.SERIAL)
        body.append(rest_loop(element(cr + (blocks * LANES + start))))
    return body
