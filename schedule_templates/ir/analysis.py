"""Small analyses on IR expressions used by the code generators and the feature extractor."""

from __future__ import annotations

from collections.abc import Iterator

from schedule_templates.ir.nodes import (
    Allocate,
    BinOp,
    Buffer,
    Call,
    Cast,
    Const,
    Expr,
    IfThen,
    Intrinsic,
    Load,
    Loop,
    Select,
    Stmt,
    Var,
    as_expr,
)


def flat_offset(buffer: Buffer, indices: tuple[Expr, ...]) -> Expr:
    """Row-major element offset of ``buffer[indices]``."""
    offset: Expr = Const(0)
    for index, stride in zip(indices, buffer.strides(), strict=True):
        offset = offset + index * stride
    return offset


def uses_var(e: Expr, var: Var) -> bool:
    if isinstance(e, Var):
        return e is var
    if isinstance(e, BinOp):
        return uses_var(e.a, var) or uses_var(e.b, var)
    if isinstance(e, Load):
        return any(uses_var(i, var) for i in e.indices)
    if isinstance(e, Select):
        return uses_var(e.cond, var) or uses_var(e.a, var) or uses_var(e.b, var)
    if isinstance(e, Call | Cast):
        return uses_var(e.arg, var)
    if isinstance(e, Intrinsic):
        return any(uses_var(a, var) for a in e.args)
    return False


def linear_coeff(e: Expr, var: Var) -> int | None:
    """The constant c with ``e = c * var + (terms free of var)``, or None if e is not affine
    in var with a constant coefficient."""
    if isinstance(e, Var):
        return 1 if e is var else 0
    if isinstance(e, Const):
        return 0
    if isinstance(e, BinOp):
        ca, cb = linear_coeff(e.a, var), linear_coeff(e.b, var)
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
    return 0 if not uses_var(e, var) else None


def substitute(e: Expr, var: Var, value: Expr | int) -> Expr:
    """``e`` with every use of ``var`` replaced (constants fold on the way)."""
    repl = as_expr(value)
    if isinstance(e, Var):
        return repl if e is var else e
    if isinstance(e, BinOp):
        from schedule_templates.ir.nodes import binop

        return binop(e.op, substitute(e.a, var, repl), substitute(e.b, var, repl))
    if isinstance(e, Load):
        return Load(e.buffer, tuple(substitute(i, var, repl) for i in e.indices))
    if isinstance(e, Select):
        return Select(substitute(e.cond, var, repl), substitute(e.a, var, repl),
                      substitute(e.b, var, repl))
    if isinstance(e, Call):
        return Call(e.fn, substitute(e.arg, var, repl))
    if isinstance(e, Cast):
        return Cast(e.to, substitute(e.arg, var, repl))
    if isinstance(e, Intrinsic):
        return Intrinsic(e.fn, tuple(substitute(a, var, repl) for a in e.args))
    return e


def loads_in(e: Expr) -> Iterator[Load]:
    if isinstance(e, Load):
        yield e
        for i in e.indices:
            yield from loads_in(i)
    elif isinstance(e, BinOp):
        yield from loads_in(e.a)
        yield from loads_in(e.b)
    elif isinstance(e, Select):
        yield from loads_in(e.cond)
        yield from loads_in(e.a)
        yield from loads_in(e.b)
    elif isinstance(e, Call | Cast):
        yield from loads_in(e.arg)
    elif isinstance(e, Intrinsic):
        for a in e.args:
            yield from loads_in(a)


def walk(body: tuple[Stmt, ...]) -> Iterator[Stmt]:
    for s in body:
        yield s
        if isinstance(s, Loop | Allocate | IfThen):
            yield from walk(s.body)
