"""The IR visitor and mutator base classes: dispatch by node class, walk order, clear errors
for unknown nodes, and mutators that rebuild only what changed."""

import dataclasses

import pytest

from schedule_templates.ir import amx, nodes, warp
from schedule_templates.ir.analysis import loads_in, stored_buffers, substitute, substitute_stmt
from schedule_templates.ir.gpu import serialize_for_host
from schedule_templates.ir.nodes import (
    Barrier,
    Buffer,
    Const,
    Expr,
    IfThen,
    Load,
    Loop,
    LoopKind,
    Prefetch,
    Scope,
    Select,
    Stmt,
    Store,
    Var,
    binop,
    call,
    cast,
    fmax,
    loop,
    prefetch,
    store,
)
from schedule_templates.ir.visitor import (
    EXPR_METHODS,
    STMT_METHODS,
    ExprFunctor,
    ExprMutator,
    ExprVisitor,
    StmtMutator,
    StmtVisitor,
    UnknownNodeError,
)

A = Buffer("a", (4, 8))
B = Buffer("b", (8,))
OUT = Buffer("out", (4, 8))


def _concrete(base: type) -> set[type]:
    """Node classes of ``nodes.py``, ``warp.py`` (warp-wide GPU statements) and ``amx.py``
    (AMX tile statements)."""
    return {cls for module in (nodes, warp, amx) for cls in vars(module).values()
            if isinstance(cls, type) and issubclass(cls, base) and cls is not base}


def test_every_node_class_has_a_method_in_the_dispatch_tables():
    # a node added to nodes.py without a visit_ method would fail every pass at run time
    assert set(EXPR_METHODS) == _concrete(Expr)
    assert set(STMT_METHODS) == _concrete(Stmt)
    for name in (*EXPR_METHODS.values(), *STMT_METHODS.values()):
        assert callable(getattr(StmtMutator, name))


class _Names(ExprVisitor):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def visit_var(self, e: Var) -> None:
        self.seen.append(e.name)

    def visit_load(self, e: Load) -> None:
        self.seen.append(e.buffer.name)
        super().visit_load(e)


def test_the_visitor_walks_operands_in_source_order():
    i, j, k = Var("i"), Var("j"), Var("k")
    e = Select(binop("<", i, 3), A[i, j] + call("exp", B[k]), cast("int32", B[j]))
    names = _Names()
    names.visit_expr(e)
    assert names.seen == ["i", "a", "i", "j", "b", "k", "b", "j"]


def test_a_statement_visitor_reaches_every_statement_and_expression():
    i, mk_i = loop("i", 4)
    j, mk_j = loop("j", 8, LoopKind.VECTORIZE)
    body = (mk_i(IfThen(binop("<", i, 3), (mk_j(store(OUT[i, j], A[i, j] * B[j])),)),
                 Barrier()),)

    class Collect(StmtVisitor):
        def __init__(self) -> None:
            self.kinds: list[str] = []
            self.loads: list[str] = []

        def visit_stmt(self, s: Stmt) -> None:
            self.kinds.append(type(s).__name__)
            super().visit_stmt(s)

        def visit_load(self, e: Load) -> None:
            self.loads.append(e.buffer.name)

    seen = Collect()
    seen.visit_body(body)
    assert seen.kinds == ["Loop", "IfThen", "Loop", "Store", "Barrier"]
    assert seen.loads == ["a", "b"]
    assert stored_buffers(body) == {OUT}


def test_a_functor_without_a_method_names_the_pass_and_the_node():
    class OnlyConstants(ExprFunctor[int]):
        def visit_const(self, e: Const) -> int:
            return int(e.value)

    assert OnlyConstants().visit_expr(Const(7)) == 7
    with pytest.raises(UnknownNodeError, match="OnlyConstants does not handle Var"):
        OnlyConstants().visit_expr(Var("x"))


def test_an_object_that_is_not_a_node_is_refused_clearly():
    @dataclasses.dataclass(frozen=True, eq=False)
    class Mystery(Expr):
        pass

    with pytest.raises(UnknownNodeError, match="Mystery is not an IR expression"):
        ExprVisitor().visit_expr(Mystery())
    with pytest.raises(UnknownNodeError, match="is not an IR statement"):
        StmtVisitor().visit_stmt(Stmt())
    with pytest.raises(TypeError):  # UnknownNodeError is a TypeError too
        ExprMutator().visit_expr(Mystery())


def test_a_subclass_of_a_node_uses_its_base_class_method():
    @dataclasses.dataclass(frozen=True, eq=False)
    class NamedVar(Var):
        pass

    names = _Names()
    names.visit_expr(NamedVar("q") + 1)
    assert names.seen == ["q"]


def test_the_identity_mutator_returns_the_very_same_objects():
    i, mk_i = loop("i", 4)
    j, mk_j = loop("j", 8)
    body = (mk_i(mk_j(store(OUT[i, j], fmax(A[i, j], 0.0) + Select(binop("<", j, 2),
                                                                      Const(1.0, "float32"),
                                                                      B[j])))),)
    assert StmtMutator().visit_body(body) is body
    value = body[0].body[0].body[0].value
    assert ExprMutator().visit_expr(value) is value


def test_a_mutator_rebuilds_only_the_path_to_a_change():
    i, j = Var("i"), Var("j")
    untouched = A[i, 1] * 2.0
    changed = B[j]
    e = untouched + changed

    class RenameB(ExprMutator):
        def visit_load(self, e: Load) -> Expr:
            if e.buffer is B:
                return Load(Buffer("b2", B.shape), e.indices)
            return super().visit_load(e)

    out = RenameB().visit_expr(e)
    assert out is not e
    assert out.a is untouched  # the sibling subtree is shared, not copied
    assert out.b.buffer.name == "b2" and out.b.indices is changed.indices


def test_substitution_folds_constants_and_leaves_binders_alone():
    i, j = Var("i"), Var("j")
    assert substitute(i * 4 + j, i, 0) is j
    assert substitute(i * 4 + 2, i, 3) == Const(14)
    inner = Loop(i, 4, LoopKind.SERIAL, (store(OUT[i, j], A[i, j]),))
    out = substitute_stmt(inner, j, 5)
    assert out.var is i  # the loop's own variable is a binder, not a use
    assert isinstance(out.body[0], Store) and out.body[0].indices[1] == Const(5)
    assert substitute_stmt(inner, Var("unused"), 1) is inner


def test_loads_are_listed_before_the_loads_in_their_indices():
    idx = Buffer("idx", (4,), Scope.GLOBAL, "float32")
    k = Var("k")
    e = A[k, 0] + B[binop("+", k, 1)] + idx[k]
    assert [ld.buffer.name for ld in loads_in(e)] == ["a", "b", "idx"]


def test_serialization_for_the_host_keeps_untouched_statements():
    t, mk_t = loop("t", 32, LoopKind.THREAD_X)
    b, mk_b = loop("b", 4, LoopKind.BLOCK_X)
    copy = store(OUT[b, t % 8], A[b, t % 8])
    kernel = nodes.Kernel("k", (A, OUT), (), (mk_b(mk_t(copy), Barrier(), mk_t(copy)),))
    host = serialize_for_host(kernel)
    outer = host.body[0]
    assert isinstance(outer, Loop) and len(outer.body) == 2  # the barrier is dropped
    assert outer.body[0] is kernel.body[0].body[0]  # nothing in the thread loop changed


def test_a_prefetch_is_an_address_not_a_read():
    i, j = Var("i"), Var("j")
    hint = prefetch(A[i + 1, B[j]], locality=1)

    class Loads(StmtVisitor):
        def __init__(self) -> None:
            self.loads: list[str] = []

        def visit_load(self, e: Load) -> None:
            self.loads.append(e.buffer.name)
            super().visit_load(e)

    seen = Loads()
    seen.visit_stmt(hint)
    assert seen.loads == ["b"]  # the load in its index, not the hinted line itself
    moved = substitute_stmt(hint, i, 2)
    assert isinstance(moved, Prefetch) and moved.locality == 1
    assert isinstance(moved.target.indices[0], Const) and moved.target.indices[0].value == 3
    assert substitute_stmt(hint, Var("other"), 0) is hint


def test_substitution_reaches_inside_a_tile_statement():
    from schedule_templates.ir.analysis import substitute_stmt

    a = Buffer("ta", (64, 32), dtype="int32")
    b = Buffer("tb", (4, 32, 16), dtype="int32")
    acc = Buffer("tacc", (32, 32), Scope.LOCAL, "int32")
    m, k = Var("m"), Var("k")
    tile = amx.TileMatmul("tdpbusd", acc, k, 2, a[m, 16 * k], 32, 512, b[0, 16 * k, 0], 16,
                          512, 2, 2)
    moved = substitute_stmt(tile, m, 32)
    assert isinstance(moved, amx.TileMatmul) and moved.a.indices[0] == Const(32)
    assert moved.b is tile.b and substitute_stmt(tile, Var("other"), 1) is tile
