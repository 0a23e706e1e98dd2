"""Small analyses and rewrites on IR used by the code generators and the feature extractor."""

from __future__ import annotations

from schedule_templates.ir.nodes import (
    BinOp,
    Buffer,
    Const,
    Expr,
    Load,
    Stmt,
    Store,
    Var,
    as_expr,
)
from schedule_templates.ir.visitor import ExprFunctor, ExprMutator, StmtMutator, StmtVisitor


def flat_offset(buffer: Buffer, indices: tuple[Expr, ...]) -> Expr:
    """Row-major element offset of ``buffer[indices]``."""
    offset: Expr = Const(0)
    for index, stride in zip(indices, buffer.strides(), strict=True):
        offset = offset + index * stride
    return offset


class _UsesVar(StmtVisitor):
    """Finds a use of one variable; stops descending once found."""

    def __init__(self, var: Var) -> None:
        self.var = var
        self.found = False

    def visit_expr(self, e: Expr) -> None:
        if not self.found:
            super().visit_expr(e)

    def visit_var(self, e: Var) -> None:
        self.found = self.found or e is self.var


def uses_var(e: Expr, var: Var) -> bool:
    finder = _UsesVar(var)
    finder.visit_expr(e)
    return finder.found


def body_uses_var(body: tuple[Stmt, ...], var: Var) -> bool:
    """Whether any expression in ``body`` (indices, values, conditions) reads ``var``."""
    finder = _UsesVar(var)
    finder.visit_body(body)
    return finder.found


class _LinearCoeff(ExprFunctor[int | None]):
    def __init__(self, var: Var) -> None:
        self.var = var

    def visit_var(self, e: Var) -> int | None:
        return 1 if e is self.var else 0

    def visit_const(self, e: Const) -> int | None:
        return 0

    def visit_binop(self, e: BinOp) -> int | None:
        ca, cb = self.visit_expr(e.a), self.visit_expr(e.b)
        if ca is None or cb is None:
            return None
        if e.op == "+":
            return ca + cb
        if e.op == "-":
            return ca - cb
        if e.op == "*":
            if ca == 0 and cb == 0:
                return 0
            if isinstance(e.b, Const) and cb == 0:
                return ca * int(e.b.value)
            if isinstance(e.a, Const) and ca == 0:
                return cb * int(e.a.value)
            return None
        return 0 if ca == 0 and cb == 0 else None

    def default_expr(self, e: Expr) -> int | None:
        return 0 if not uses_var(e, self.var) else None


def linear_coeff(e: Expr, var: Var) -> int | None:
    """The constant c with ``e = c * var + (terms free of var)``, or None if e is not affine
    in var with a constant coefficient."""
    return _LinearCoeff(var).visit_expr(e)


class Substitute(StmtMutator):
    """Every use of ``var`` replaced by ``value`` (constants fold on the way)."""

    def __init__(self, var: Var, value: Expr | int) -> None:
        self.var = var
        self.value = as_expr(value)

    def visit_var(self, e: Var) -> Expr:
        return self.value if e is self.var else e


def substitute(e: Expr, var: Var, value: Expr | int) -> Expr:
    """``e`` with every use of ``var`` replaced (constants fold on the way)."""
    return Substitute(var, value).visit_expr(e)


def substitute_stmt(s: Stmt, var: Var, value: Expr | int) -> Stmt:
    """``s`` with every use of ``var`` in its expressions replaced."""
    return Substitute(var, value).visit_stmt(s)


class _Loads(StmtVisitor):
    def __init__(self) -> None:
        self.loads: list[Load] = []

    def visit_load(self, e: Load) -> None:
        self.loads.append(e)
        super().visit_load(e)


def loads_in(e: Expr) -> list[Load]:
    """The loads in ``e`` in source order, each before the loads in its own indices."""
    collector = _Loads()
    collector.visit_expr(e)
    return collector.loads


class _StoredBuffers(StmtVisitor):
    def __init__(self) -> None:
        self.buffers: set[Buffer] = set()

    def visit_expr(self, e: Expr) -> None:
        return None  # only the statements matter

    def visit_store(self, s: Store) -> None:
        self.buffers.add(s.buffer)


def stored_buffers(body: tuple[Stmt, ...]) -> set[Buffer]:
    """The buffers some store in ``body`` writes."""
    collector = _StoredBuffers()
    collector.visit_body(body)
    return collector.buffers


class ReplaceLoads(ExprMutator):
    """Chosen load nodes (keyed by ``id``) replaced by given expressions; other loads keep
    their place with their indices rewritten."""

    def __init__(self, replacements: dict[int, Expr]) -> None:
        self.replacements = replacements  # keyed by id() of the Load node

    def visit_load(self, e: Load) -> Expr:
        replacement = self.replacements.get(id(e))
        return super().visit_load(e) if replacement is None else replacement
