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
    Select,
    Stmt,
    Store,
    Var,
)

_PRECEDENCE = {"and": 1, "<": 2, "<=": 2, ">=": 2, ">": 2, "==": 2, "!=": 2,
               "+": 3, "-": 3, "*": 4, "//": 4, "%": 4, "/": 4}


def format_expr(e: Expr, parent: int = 0) -> str:
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Const):
        return repr(float(e.value)) if e.dtype == "float32" else str(e.value)
    if isinstance(e, Load):
        return f"{e.buffer.name}[{', '.join(format_expr(i) for i in e.indices)}]"
    if isinstance(e, Select):
        return f"select({format_expr(e.cond)}, {format_expr(e.a)}, {format_expr(e.b)})"
    if isinstance(e, Call):
        return f"{e.fn}({format_expr(e.arg)})"
    if isinstance(e, Cast):
        return f"{e.to}({format_expr(e.arg)})"
    if isinstance(e, Intrinsic):
        return f"{e.fn}({', '.join(format_expr(a) for a in e.args)})"
    if isinstance(e, BinOp):
        if e.op in ("max", "min"):
            return f"{e.op}({format_expr(e.a)}, {format_expr(e.b)})"
        prec = _PRECEDENCE[e.op]
        text = f"{format_expr(e.a, prec)} {e.op} {format_expr(e.b, prec + 1)}"
        return f"({text})" if prec < parent else text
    raise TypeError(f"unknown expression {e!r}")


def _buffer_decl(b: Buffer) -> str:
    slack = f" +{b.slack}" if b.slack else ""
    return f"{b.name}: {b.dtype}[{', '.join(map(str, b.shape))}{slack}] {b.scope.value}"


def _stmt_lines(s: Stmt, depth: int) -> list[str]:
    pad = "  " * depth
    if isinstance(s, Loop):
        kind = "" if s.kind is LoopKind.SERIAL else f"{s.kind.value} "
        head = f"{pad}{kind}for {s.var.name} in 0..{s.extent}:"
        return [head, *_body_lines(s.body, depth + 1)]
    if isinstance(s, Store):
        target = f"{s.buffer.name}[{', '.join(format_expr(i) for i in s.indices)}]"
        return [f"{pad}{target} = {format_expr(s.value)}"]
    if isinstance(s, Allocate):
        return [f"{pad}alloc {_buffer_decl(s.buffer)}", *_body_lines(s.body, depth)]
    if isinstance(s, IfThen):
        return [f"{pad}if {format_expr(s.cond)}:", *_body_lines(s.body, depth + 1)]
    if isinstance(s, Barrier):
        return [f"{pad}barrier"]
    raise TypeError(f"unknown statement {s!r}")


def _body_lines(body: tuple[Stmt, ...], depth: int) -> list[str]:
    return [line for s in body for line in _stmt_lines(s, depth)]


def format_kernel(kernel: Kernel) -> str:
    lines = [f"kernel {kernel.name}("]
    lines += [f"    {_buffer_decl(b)}," for b in (*kernel.params, *kernel.workspace)]
    lines.append("):")
    lines += _body_lines(kernel.body, 1)
    return "\n".join(lines) + "\n"
