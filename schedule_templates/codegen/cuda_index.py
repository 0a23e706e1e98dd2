"""Index arithmetic for the CUDA generator: provable alignment and tidy sums."""

from __future__ import annotations

from schedule_templates.ir.analysis import flat_offset, linear_coeff, substitute
from schedule_templates.ir.nodes import BinOp, Buffer, Const, Expr, Scope, Select, Var
from schedule_templates.ir.visitor import ExprFunctor, ExprMutator


class _Divisible(ExprFunctor[bool]):
    def __init__(self, n: int) -> None:
        self.n = n

    def default_expr(self, e: Expr) -> bool:
        return False

    def visit_const(self, e: Const) -> bool:
        return isinstance(e.value, int) and e.value % self.n == 0

    def visit_binop(self, e: BinOp) -> bool:
        if e.op in ("+", "-", "max", "min"):
            return self.visit_expr(e.a) and self.visit_expr(e.b)
        if e.op == "*":
            return self.visit_expr(e.a) or self.visit_expr(e.b)
        return False

    def visit_select(self, e: Select) -> bool:
        return self.visit_expr(e.a) and self.visit_expr(e.b)


def divisible(e: Expr, n: int) -> bool:
    """True when ``e`` is provably a multiple of ``n`` for every value of its variables."""
    return _Divisible(n).visit_expr(e)


class _FoldSums(ExprMutator):
    """Integer sums with their constants gathered at the end."""

    def visit_binop(self, e: BinOp) -> Expr:
        if e.op not in ("+", "-") or e.dtype != "int64":
            return super().visit_binop(e)
        terms: list[tuple[int, Expr]] = []
        constant = _gather(e, 1, terms)
        out: Expr | None = None
        for sign, term in terms:
            folded = self.visit_expr(term)
            if out is None:
                out = folded if sign > 0 else Const(0) - folded
            else:
                out = BinOp("+" if sign > 0 else "-", out, folded)
        if out is None:
            return Const(constant)
        if constant:
            out = BinOp("+" if constant > 0 else "-", out, Const(abs(constant)))
        return out


def fold_sums(e: Expr) -> Expr:
    """Integer sums with their constants gathered at the end: ``t*4 + 1 + 1`` is ``t*4 + 2``."""
    return _FoldSums().visit_expr(e)


def _gather(e: Expr, sign: int, terms: list[tuple[int, Expr]]) -> int:
    if isinstance(e, BinOp) and e.op in ("+", "-"):
        return _gather(e.a, sign, terms) + _gather(e.b, sign if e.op == "+" else -sign, terms)
    if isinstance(e, Const) and e.dtype == "int64":
        return sign * int(e.value)
    terms.append((sign, e))
    return 0


def vector_access(buf: Buffer, indices: tuple[Expr, ...], lane: Var, lanes: int) -> bool:
    """Unit stride along the lane and a first address that is a multiple of the width."""
    if buf.scope is Scope.LOCAL:  # register arrays are never reinterpreted
        return False
    offset = flat_offset(buf, indices)
    if linear_coeff(offset, lane) != 1:
        return False
    return divisible(substitute(offset, lane, 0), lanes)
