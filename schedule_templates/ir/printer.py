"""Readable pseudo-code for a loop nest: what a config means, for people."""

from __future__ import annotations

from schedule_templates.ir.nodes import (
    Allocate,
    Barrier,
    BinOp,
    Buffer,
    Call,
    Cast,
    Const,
    Expr,
    IfThen,
    Intrinsic,
    Kernel,
    Load,
    Loop,
    LoopKind,
    Prefetch,
    Select,
    Stmt,
    Store,
    Var,
)
from schedule_templates.ir.visitor import ExprFunctor, StmtFunctor

_PRECEDENCE = {"and": 1, "<": 2, "<=": 2, ">=": 2, ">": 2, "==": 2, "!=": 2,
               "+": 3, "-": 3, "*": 4, "//": 4, "%": 4, "/": 4}
_ATOM = 100  # precedence of text that never needs brackets


class _Printer(ExprFunctor[tuple[str, int]], StmtFunctor[list[str]]):
    """Expressions as (text, precedence of its outermost operator); statements as lines."""

    def __init__(self) -> None:
        self.depth = 0

    def text(self, e: Expr, parent: int = 0) -> str:
        text, prec = self.visit_expr(e)
        return f"({text})" if prec < parent else text

    def _list(self, exprs: tuple[Expr, ...]) -> str:
        return ", ".join(self.text(e) for e in exprs)

    def visit_var(self, e: Var) -> tuple[str, int]:
        return e.name, _ATOM

    def visit_const(self, e: Const) -> tuple[str, int]:
        return (repr(float(e.value)) if e.dtype == "float32" else str(e.value)), _ATOM

    def visit_load(self, e: Load) -> tuple[str, int]:
        return f"{e.buffer.name}[{self._list(e.indices)}]", _ATOM

    def visit_select(self, e: Select) -> tuple[str, int]:
        return f"select({self._list((e.cond, e.a, e.b))})", _ATOM

    def visit_call(self, e: Call) -> tuple[str, int]:
        return f"{e.fn}({self.text(e.arg)})", _ATOM

    def visit_cast(self, e: Cast) -> tuple[str, int]:
        return f"{e.to}({self.text(e.arg)})", _ATOM

    def visit_intrinsic(self, e: Intrinsic) -> tuple[str, int]:
        return f"{e.fn}({self._list(e.args)})", _ATOM

    def visit_binop(self, e: BinOp) -> tuple[str, int]:
        if e.op in ("max", "min"):
            return f"{e.op}({self._list((e.a, e.b))})", _ATOM
        prec = _PRECEDENCE[e.op]
        return f"{self.text(e.a, prec)} {e.op} {self.text(e.b, prec + 1)}", prec

    # -- statements ----------------------------------------------------------------------------
    def lines(self, body: tuple[Stmt, ...], depth: int) -> list[str]:
        outer, self.depth = self.depth, depth
        out = [line for s in body for line in self.visit_stmt(s)]
        self.depth = outer
        return out

    def visit_loop(self, s: Loop) -> list[str]:
        kind = "" if s.kind is LoopKind.SERIAL else f"{s.kind.value} "
        head = f"{self._pad()}{kind}for {s.var.name} in 0..{s.extent}:"
        return [head, *self.lines(s.body, self.depth + 1)]

    def visit_store(self, s: Store) -> list[str]:
        return [f"{self._pad()}{s.buffer.name}[{self._list(s.indices)}] = {self.text(s.value)}"]

    def visit_allocate(self, s: Allocate) -> list[str]:
        return [f"{self._pad()}alloc {_buffer_decl(s.buffer)}", *self.lines(s.body, self.depth)]

    def visit_ifthen(self, s: IfThen) -> list[str]:
        return [f"{self._pad()}if {self.text(s.cond)}:", *self.lines(s.body, self.depth + 1)]

    def visit_barrier(self, s: Barrier) -> list[str]:
        return [f"{self._pad()}barrier"]

    def visit_prefetch(self, s: Prefetch) -> list[str]:
        target = s.target
        return [f"{self._pad()}prefetch {target.buffer.name}[{self._list(target.indices)}]"
                f" locality={s.locality}"]

    def _pad(self) -> str:
        return "  " * self.depth


def _buffer_decl(b: Buffer) -> str:
    slack = f" +{b.slack}" if b.slack else ""
    return f"{b.name}: {b.dtype}[{', '.join(map(str, b.shape))}{slack}] {b.scope.value}"


def format_kernel(kernel: Kernel) -> str:
    lines = [f"kernel {kernel.name}("]
    lines += [f"    {_buffer_decl(b)}," for b in (*kernel.params, *kernel.workspace)]
    lines.append("):")
    lines += _Printer().lines(kernel.body, 1)
    return "\n".join(lines) + "\n"
