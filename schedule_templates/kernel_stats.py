"""What the feature vector of a kernel is computed from (``features.py`` lays it out).

Each store with the loops and guards around it and the float operations of its value (``a * b +
c`` is one FMA), the memory each scope allocates and the barriers executed, and each buffer
access as flat-offset coefficients per loop variable (variables used non-affinely are opaque).
Changing what is counted here changes the vectors: bump ``FEATURE_VERSION`` in ``features.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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
    Load,
    Loop,
    Select,
    Stmt,
    Store,
    Var,
)
from schedule_templates.ir.visitor import ExprFunctor, ExprVisitor, StmtVisitor

OPS = ("add", "mul", "fma", "minmax", "select")
OPAQUE = -1.0  # stride of an access whose offset is not affine in the loop variable

_ADD, _MUL, _FMA, _MINMAX, _SELECT = range(len(OPS))
_FLOAT_OPS = {"+": _ADD, "-": _ADD, "*": _MUL, "/": _MUL, "max": _MINMAX, "min": _MINMAX}
#: a math function counted as the FMAs its inline code takes (llvm_math.py); the one-instruction
#: intrinsics count as a mul. Kernels without calls keep the vectors they had.
_CALL_FMAS = {"exp": 10, "log": 14, "sigmoid": 12, "tanh": 20, "erf": 24, "sqrt": 0, "abs": 0,
              "floor": 0}


@dataclass
class Access:
    """One buffer access of a statement, as coefficients of its flat offset."""

    buffer: Buffer
    write: bool
    coeffs: dict[Var, int]  # flat-offset coefficient of each loop variable
    opaque: set[Var]  # variables the offset depends on non-affinely (// % or indirect)

    def stride(self, var: Var) -> float:
        """|coefficient| along ``var``, or -1 (kept as -1 by the log scaling) when opaque."""
        return OPAQUE if var in self.opaque else float(abs(self.coeffs.get(var, 0)))


@dataclass
class Statement:
    """One store, the loops and guards around it and what one execution of it does."""

    store: Store
    loops: tuple[Loop, ...]
    guards: int
    ops: list[int] = field(default_factory=lambda: [0] * len(OPS))
    loads: int = 0
    trips: int = 1  # iterations of the loops around it

    @property
    def work(self) -> int:
        return self.trips * (1 + sum(self.ops))


class _Statements(StmtVisitor):
    """Collects the stores with the loops around them; ``memory`` sums allocations per scope
    and counts executed barriers (under the key ``"barrier"``)."""

    def __init__(self) -> None:
        self.loops: tuple[Loop, ...] = ()
        self.guards = 0
        self.out: list[Statement] = []
        self.memory: dict[str, int] = {}

    def visit_loop(self, s: Loop) -> None:
        outer, self.loops = self.loops, (*self.loops, s)
        self.visit_body(s.body)
        self.loops = outer

    def visit_allocate(self, s: Allocate) -> None:
        scope = s.buffer.scope._value_
        self.memory[scope] = self.memory.get(scope, 0) + s.buffer.size
        self.visit_body(s.body)

    def visit_ifthen(self, s: IfThen) -> None:
        self.guards += 1
        self.visit_body(s.body)
        self.guards -= 1

    def visit_barrier(self, s: Barrier) -> None:
        executed = math.prod(lp.extent for lp in self.loops)
        self.memory["barrier"] = self.memory.get("barrier", 0) + executed

    def visit_store(self, s: Store) -> None:
        stmt = Statement(s, self.loops, self.guards,
                          trips=math.prod(lp.extent for lp in self.loops))
        _OpCounter(stmt).visit_expr(s.value)
        self.out.append(stmt)


class _OpCounter(ExprFunctor[bool]):
    """Counts the float operations of one evaluation of an expression (``a * b + c`` counts as
    one FMA, not a mul and an add); each visit returns whether the node is a float value. Index
    arithmetic is not walked: the code generators hoist it out of the inner loops. Avoids
    ``Expr.dtype``, which recurses: this runs for every candidate the search scores. Variables,
    casts and intrinsics count nothing (feature version 1)."""

    def __init__(self, stmt: Statement) -> None:
        self.stmt = stmt

    def default_expr(self, e: Expr) -> bool:
        return False

    def visit_binop(self, e: BinOp) -> bool:
        fa, fb = self.visit_expr(e.a), self.visit_expr(e.b)
        ops = self.stmt.ops
        if not (fa or fb):
            return False
        kind = _FLOAT_OPS.get(e.op)
        if kind is None:  # comparison or logic on floats
            ops[_SELECT] += 1
            return False
        if kind == _ADD and e.op == "+" and (
                (fa and type(e.a) is BinOp and e.a.op == "*")
                or (fb and type(e.b) is BinOp and e.b.op == "*")):
            ops[_MUL] -= 1
            ops[_FMA] += 1
        else:
            ops[kind] += 1
        return True

    def visit_load(self, e: Load) -> bool:
        self.stmt.loads += 1
        return e.buffer.dtype == "float32"

    def visit_select(self, e: Select) -> bool:
        self.stmt.ops[_SELECT] += 1
        self.visit_expr(e.cond)
        fa = self.visit_expr(e.a)
        return self.visit_expr(e.b) or fa

    def visit_const(self, e: Const) -> bool:
        return e.const_dtype == "float32"

    def visit_call(self, e: Call) -> bool:
        self.visit_expr(e.arg)
        fmas = _CALL_FMAS[e.fn]
        self.stmt.ops[_FMA if fmas else _MUL] += fmas or 1
        return True


class _Variables(ExprVisitor):
    """The variables of an expression (through arithmetic, loads and selects only)."""

    def __init__(self, out: set[Var]) -> None:
        self.out = out

    def visit_var(self, e: Var) -> None:
        self.out.add(e)

    def visit_call(self, e: Call) -> None:
        return None

    def visit_cast(self, e: Cast) -> None:
        return None

    def visit_intrinsic(self, e: Intrinsic) -> None:
        return None


class _Affine(ExprFunctor[None]):
    """Adds ``scale`` times the affine part of an expression to ``coeffs``; other variables go
    to ``opaque``. One pass per index expression (cheaper than a pass per variable)."""

    def __init__(self, coeffs: dict[Var, int], opaque: set[Var]) -> None:
        self.coeffs = coeffs
        self.opaque = opaque
        self.scale = 1

    def add(self, e: Expr, scale: int) -> None:
        outer, self.scale = self.scale, scale
        self.visit_expr(e)
        self.scale = outer

    def visit_var(self, e: Var) -> None:
        self.coeffs[e] = self.coeffs.get(e, 0) + self.scale

    def visit_const(self, e: Const) -> None:
        return None

    def visit_binop(self, e: BinOp) -> None:
        scale = self.scale
        if e.op in ("+", "-"):
            self.visit_expr(e.a)
            self.scale = -scale if e.op == "-" else scale
            self.visit_expr(e.b)
        elif e.op == "*" and type(e.b) is Const:
            self.scale = scale * int(e.b.value)
            self.visit_expr(e.a)
        elif e.op == "*" and type(e.a) is Const:
            self.scale = scale * int(e.a.value)
            self.visit_expr(e.b)
        else:
            self.default_expr(e)
        self.scale = scale

    def default_expr(self, e: Expr) -> None:
        _Variables(self.opaque).visit_expr(e)


def _access(buffer: Buffer, indices: tuple[Expr, ...], write: bool,
            strides: dict[Buffer, tuple[int, ...]]) -> Access:
    coeffs: dict[Var, int] = {}
    opaque: set[Var] = set()
    if buffer not in strides:
        strides[buffer] = buffer.strides()
    affine = _Affine(coeffs, opaque)
    for index, stride in zip(indices, strides[buffer], strict=True):
        affine.add(index, stride)
    return Access(buffer, write, coeffs, opaque)


class _AccessLoads(ExprVisitor):
    """The loads of a value in source order, through arithmetic, selects and calls only (not
    into load indices, casts or intrinsics: feature version 1)."""

    def __init__(self) -> None:
        self.loads: list[Load] = []

    def visit_load(self, e: Load) -> None:
        self.loads.append(e)

    def visit_cast(self, e: Cast) -> None:
        return None

    def visit_intrinsic(self, e: Intrinsic) -> None:
        return None


def store_accesses(stmt: Statement, limit: int) -> list[Access]:
    """The store's access, then those of the loads in its value in source order (``limit`` in
    all)."""
    strides: dict[Buffer, tuple[int, ...]] = {}
    out = [_access(stmt.store.buffer, stmt.store.indices, True, strides)]
    loads = _AccessLoads()
    loads.visit_expr(stmt.store.value)
    for e in loads.loads:
        if len(out) >= limit:
            break
        out.append(_access(e.buffer, e.indices, False, strides))
    return out


def statements(body: tuple[Stmt, ...]) -> tuple[list[Statement], dict[str, int]]:
    """The stores of ``body`` with their loops, and the memory and barrier totals (see
    ``_Statements``)."""
    collector = _Statements()
    collector.visit_body(body)
    return collector.out, collector.memory
