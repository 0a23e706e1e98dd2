"""Functors, visitors and mutators over the loop-nest IR: the one walk every pass shares.

A pass subclasses one of the classes below and overrides the ``visit_<node>`` methods of the
nodes it cares about. Dispatch is a table from node class to method, built once per pass class
when the class is defined (no isinstance chain); a node kind a pass does not override goes to
``default_expr`` / ``default_stmt``, which raise ``UnknownNodeError`` naming the pass and the node
unless the pass gives its own fallback.

- ``ExprFunctor[R]`` / ``StmtFunctor[R]``: one value per node (code text, an LLVM value, a flag);
- ``ExprVisitor`` / ``StmtVisitor``: walk every child in source order and return nothing; a pass
  overrides the nodes it collects or checks;
- ``ExprMutator`` / ``StmtMutator``: rebuild a tree bottom-up and return the very same object for
  every node whose children did not change, so identity-keyed maps (loads, buffers, variables)
  stay valid and an untouched tree is not copied. Changed binary operations are rebuilt with
  ``binop`` so constants fold on the way (``substitute(i * 4, i, 0)`` is ``0``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

from schedule_templates.errors import ScheduleError
from schedule_templates.ir.amx import TileMatmul
from schedule_templates.ir.nodes import (
    Allocate,
    Barrier,
    BinOp,
    Call,
    Cast,
    Const,
    Expr,
    IfThen,
    Intrinsic,
    Load,
    Loop,
    Prefetch,
    Select,
    Stmt,
    Store,
    Var,
    binop,
)
from schedule_templates.ir.warp import WarpMma

R = TypeVar("R")
_Method = Callable[[Any, Any], Any]

#: node class -> name of the method that handles it (the dispatch tables are built from these)
EXPR_METHODS: dict[type[Expr], str] = {
    Var: "visit_var", Const: "visit_const", BinOp: "visit_binop", Load: "visit_load",
    Select: "visit_select", Call: "visit_call", Cast: "visit_cast",
    Intrinsic: "visit_intrinsic",
}
STMT_METHODS: dict[type[Stmt], str] = {
    Store: "visit_store", Loop: "visit_loop", Allocate: "visit_allocate",
    IfThen: "visit_ifthen", Barrier: "visit_barrier", WarpMma: "visit_warp_mma",
    Prefetch: "visit_prefetch", TileMatmul: "visit_tile_matmul",
}
#: statements a pass that does not override them handles through their ``expand()`` form
#: (the same arithmetic in ordinary nodes), not through ``default_stmt``
_EXPANDED = {"visit_warp_mma", "visit_tile_matmul"}


class UnknownNodeError(ScheduleError, TypeError):
    """A pass met a node it has no method for (a bug: a new node kind or a wrong input)."""


def _table(cls: type, methods: dict[Any, str], root: type, default: str) -> dict[type, _Method]:
    """Node class -> the method of ``cls`` for it; a method ``cls`` inherits unchanged from the
    functor ``root`` goes straight to the default (one call less per node)."""
    table = {}
    for node, name in methods.items():
        method = getattr(cls, name)
        inherited = method is getattr(root, name) and name not in _EXPANDED
        table[node] = getattr(cls, default) if inherited else method
    return table


def _lookup(table: dict[type, _Method], node: object, what: str) -> _Method:
    """The method for a subclass of a known node; a clear error for anything else."""
    for base in type(node).__mro__[1:]:
        if base in table:
            return table[base]
    raise UnknownNodeError(f"{type(node).__name__} is not an IR {what} ({node!r})")


class ExprFunctor(Generic[R]):
    """One value of type ``R`` per expression node, by the node's class."""

    _expr_table: ClassVar[dict[type, _Method]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._expr_table = _table(cls, EXPR_METHODS, ExprFunctor, "default_expr")

    def visit_expr(self, e: Expr) -> R:
        try:
            method = self._expr_table[type(e)]
        except KeyError:
            method = _lookup(self._expr_table, e, "expression")
        return method(self, e)

    def default_expr(self, e: Expr) -> R:
        """Called for node kinds this pass does not override."""
        raise UnknownNodeError(f"{type(self).__name__} does not handle {type(e).__name__}")

    def visit_var(self, e: Var) -> R:
        return self.default_expr(e)

    def visit_const(self, e: Const) -> R:
        return self.default_expr(e)

    def visit_binop(self, e: BinOp) -> R:
        return self.default_expr(e)

    def visit_load(self, e: Load) -> R:
        return self.default_expr(e)

    def visit_select(self, e: Select) -> R:
        return self.default_expr(e)

    def visit_call(self, e: Call) -> R:
        return self.default_expr(e)

    def visit_cast(self, e: Cast) -> R:
        return self.default_expr(e)

    def visit_intrinsic(self, e: Intrinsic) -> R:
        return self.default_expr(e)


class StmtFunctor(Generic[R]):
    """One value of type ``R`` per statement node, by the node's class."""

    _stmt_table: ClassVar[dict[type, _Method]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._stmt_table = _table(cls, STMT_METHODS, StmtFunctor, "default_stmt")

    def visit_stmt(self, s: Stmt) -> R:
        try:
            method = self._stmt_table[type(s)]
        except KeyError:
            method = _lookup(self._stmt_table, s, "statement")
        return method(self, s)

    def default_stmt(self, s: Stmt) -> R:
        """Called for statement kinds this pass does not override."""
        raise UnknownNodeError(f"{type(self).__name__} does not handle {type(s).__name__}")

    def visit_store(self, s: Store) -> R:
        return self.default_stmt(s)

    def visit_loop(self, s: Loop) -> R:
        return self.default_stmt(s)

    def visit_allocate(self, s: Allocate) -> R:
        return self.default_stmt(s)

    def visit_ifthen(self, s: IfThen) -> R:
        return self.default_stmt(s)

    def visit_barrier(self, s: Barrier) -> R:
        return self.default_stmt(s)

    def visit_prefetch(self, s: Prefetch) -> R:
        return self.default_stmt(s)

    def visit_warp_mma(self, s: WarpMma) -> R:
        return self.visit_stmt(s.expand())

    def visit_tile_matmul(self, s: TileMatmul) -> R:
        return self.visit_stmt(s.expand())


class ExprVisitor(ExprFunctor[None]):
    """Visits every sub-expression, operands in source order."""

    def visit_var(self, e: Var) -> None:
        return None

    def visit_const(self, e: Const) -> None:
        return None

    def visit_binop(self, e: BinOp) -> None:
        self.visit_expr(e.a)
        self.visit_expr(e.b)

    def visit_load(self, e: Load) -> None:
        for index in e.indices:
            self.visit_expr(index)

    def visit_select(self, e: Select) -> None:
        self.visit_expr(e.cond)
        self.visit_expr(e.a)
        self.visit_expr(e.b)

    def visit_call(self, e: Call) -> None:
        self.visit_expr(e.arg)

    def visit_cast(self, e: Cast) -> None:
        self.visit_expr(e.arg)

    def visit_intrinsic(self, e: Intrinsic) -> None:
        for arg in e.args:
            self.visit_expr(arg)


class StmtVisitor(StmtFunctor[None], ExprVisitor):
    """Visits every statement in order and every expression in them (indices before values)."""

    def visit_body(self, body: tuple[Stmt, ...]) -> None:
        for s in body:
            self.visit_stmt(s)

    def visit_store(self, s: Store) -> None:
        for index in s.indices:
            self.visit_expr(index)
        self.visit_expr(s.value)

    def visit_loop(self, s: Loop) -> None:
        self.visit_body(s.body)

    def visit_allocate(self, s: Allocate) -> None:
        self.visit_body(s.body)

    def visit_ifthen(self, s: IfThen) -> None:
        self.visit_expr(s.cond)
        self.visit_body(s.body)

    def visit_barrier(self, s: Barrier) -> None:
        return None

    def visit_prefetch(self, s: Prefetch) -> None:
        for index in s.target.indices:  # an address, not a read: the load itself is not visited
            self.visit_expr(index)


class ExprMutator(ExprFunctor[Expr]):
    """Rebuilds an expression; unchanged subtrees come back as the same objects."""

    def visit_exprs(self, exprs: tuple[Expr, ...]) -> tuple[Expr, ...]:
        """The mutated tuple, or ``exprs`` itself when no element changed."""
        out = tuple(self.visit_expr(e) for e in exprs)
        return exprs if all(new is old for new, old in zip(out, exprs, strict=True)) else out

    def visit_var(self, e: Var) -> Expr:
        return e

    def visit_const(self, e: Const) -> Expr:
        return e

    def visit_binop(self, e: BinOp) -> Expr:
        a, b = self.visit_expr(e.a), self.visit_expr(e.b)
        return e if a is e.a and b is e.b else binop(e.op, a, b)

    def visit_load(self, e: Load) -> Expr:
        indices = self.visit_exprs(e.indices)
        return e if indices is e.indices else Load(e.buffer, indices)

    def visit_select(self, e: Select) -> Expr:
        cond, a, b = self.visit_expr(e.cond), self.visit_expr(e.a), self.visit_expr(e.b)
        unchanged = cond is e.cond and a is e.a and b is e.b
        return e if unchanged else Select(cond, a, b)

    def visit_call(self, e: Call) -> Expr:
        arg = self.visit_expr(e.arg)
        return e if arg is e.arg else Call(e.fn, arg)

    def visit_cast(self, e: Cast) -> Expr:
        arg = self.visit_expr(e.arg)
        return e if arg is e.arg else Cast(e.to, arg)

    def visit_intrinsic(self, e: Intrinsic) -> Expr:
        args = self.visit_exprs(e.args)
        return e if args is e.args else Intrinsic(e.fn, args)


class StmtMutator(StmtFunctor[Stmt], ExprMutator):
    """Rebuilds statements (and the expressions in them); unchanged ones stay the same objects.
    Loop variables are binders, not uses: they are not visited."""

    def visit_body(self, body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
        """The mutated body, or ``body`` itself when no statement changed."""
        out = tuple(self.visit_stmt(s) for s in body)
        return body if all(new is old for new, old in zip(out, body, strict=True)) else out

    def visit_store(self, s: Store) -> Stmt:
        indices, value = self.visit_exprs(s.indices), self.visit_expr(s.value)
        return s if indices is s.indices and value is s.value else Store(s.buffer, indices, value)

    def visit_loop(self, s: Loop) -> Stmt:
        body = self.visit_body(s.body)
        return s if body is s.body else Loop(s.var, s.extent, s.kind, body)

    def visit_allocate(self, s: Allocate) -> Stmt:
        body = self.visit_body(s.body)
        return s if body is s.body else Allocate(s.buffer, body)

    def visit_ifthen(self, s: IfThen) -> Stmt:
        cond, body = self.visit_expr(s.cond), self.visit_body(s.body)
        return s if cond is s.cond and body is s.body else IfThen(cond, body)

    def visit_barrier(self, s: Barrier) -> Stmt:
        return s

    def visit_prefetch(self, s: Prefetch) -> Stmt:
        indices = self.visit_exprs(s.target.indices)
        if indices is s.target.indices:
            return s
        return Prefetch(Load(s.target.buffer, indices), s.locality)

    def visit_warp_mma(self, s: WarpMma) -> Stmt:
        acc, a, b, lane = (self.visit_expr(e) for e in (s.acc, s.a, s.b, s.lane))
        unchanged = acc is s.acc and a is s.a and b is s.b and lane is s.lane
        if unchanged:
            return s
        if not (isinstance(acc, Load) and isinstance(a, Load) and isinstance(b, Load)):
            return self.visit_stmt(s.expand())  # a pass replaced a buffer access by a value
        return WarpMma(acc, a, b, lane)

    def visit_tile_matmul(self, s: TileMatmul) -> Stmt:
        a, b = self.visit_expr(s.a), self.visit_expr(s.b)
        if a is s.a and b is s.b:
            return s
        if not (isinstance(a, Load) and isinstance(b, Load)):
            return self.visit_stmt(s.expand())  # a pass replaced a buffer access by a value
        return dataclasses.replace(s, a=a, b=b)


ExprFunctor._expr_table = _table(ExprFunctor, EXPR_METHODS, ExprFunctor, "default_expr")
StmtFunctor._stmt_table = _table(StmtFunctor, STMT_METHODS, StmtFunctor, "default_stmt")
