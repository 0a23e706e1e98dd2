"""Elementwise chains: one kernel for a run of fused unary/binary/parametric operations.

The planner hands over the output shape, each input's (numpy-broadcastable) shape and a tiny
register program; the kernel reads each input once per output element and writes the result
once, so a chain such as ``x * sigmoid(x) + bias`` costs one pass over memory instead of one per
operation. The schedule: collapse the axes every input treats alike, thread the outer loops
when there is enough work, and walk the contiguous axis as 16-lane SIMD, where a broadcast
input is a splat and a full one a vector load. A program value used more than once is kept in a
LOCAL temporary (registers) instead of being re-expanded into the expression tree.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

import numpy as np

from schedule_templates.ir.nodes import Buffer, Const, Expr, Kernel, Stmt, call, fmax, fmin, store
from schedule_templates.ops.base import GeneratedOp, GeneratedOpError, Shape, register_op
from schedule_templates.ops.loops import (
    Axis,
    collapse,
    fconst,
    flat,
    kernel_name,
    local,
    nest,
    row_major,
    split_long_inner,
    vector_split,
    want_parallel,
)

Instruction = tuple[str | float, ...]

UNARY = ("neg", "abs", "exp", "log", "sqrt", "tanh", "erf", "sigmoid", "relu", "reciprocal",
         "gelu", "hardswish", "floor")
BINARY = ("add", "sub", "mul", "div", "max", "min", "pow")
#: op -> number of float literal parameters after the one value operand
PARAMETRIC = {"clip": 2, "hardsigmoid": 2, "leakyrelu": 1}
_SQRT1_2 = 1.0 / math.sqrt(2.0)


@register_op
@dataclasses.dataclass(frozen=True)
class Elementwise(GeneratedOp):
    kind = "elementwise"
    shape: Shape
    inputs: tuple[Shape, ...]
    program: tuple[Instruction, ...]

    def __post_init__(self) -> None:
        _check_shape(self.shape, "shape")
        if not isinstance(self.inputs, tuple) or not self.inputs:
            raise GeneratedOpError("elementwise: at least one input shape is needed")
        for k, s in enumerate(self.inputs):
            _check_shape(s, f"input x{k}")
            if len(s) > len(self.shape) or any(
                d not in (1, o) for d, o in zip(reversed(s), reversed(self.shape), strict=False)
            ):
                raise GeneratedOpError(f"elementwise: input x{k} {s} does not broadcast to "
                                       f"{self.shape}")
        _check_program(self.program, len(self.inputs))

    def input_shapes(self) -> dict[str, Shape]:
        return {f"x{k}": s for k, s in enumerate(self.inputs)}

    def output_shape(self) -> Shape:
        return self.shape

    def lower(self) -> Kernel:
        ins = [flat(f"x{k}", s) for k, s in enumerate(self.inputs)]
        out = flat("out", self.shape)
        axes = collapse(self._axes()) or [Axis(1, (0,) * (len(ins) + 1))]
        outer, inner = axes[:-1], axes[-1]
        outer, inner, tail = split_long_inner(outer, inner)
        uses = _use_counts(self.program)
        temps = [local(f"t{n}") for n, count in enumerate(uses) if count > 1]
        size = math.prod(self.shape)

        def walk(extent: int, start: int) -> Callable[[tuple[Expr, ...]], list[Stmt]]:
            def inner_body(offsets: tuple[Expr, ...]) -> list[Stmt]:
                def lanes(pos: Expr, lane: Expr) -> list[Stmt]:
                    # inner strides are 1 (full) or 0 (broadcast) for every buffer
                    loads: list[Expr] = [
                        b[o + pos * s] for b, o, s in zip(ins, offsets, inner.strides,
                                                          strict=False)]
                    stmts, value = _emit(self.program, loads, {t.name: t for t in temps}, lane)
                    return [*stmts, store(out[offsets[-1] + pos], value)]

                return vector_split(extent, start, lanes, temps=temps)

            return inner_body

        bases = tuple(Const(0) for _ in range(len(ins) + 1))
        body = nest(outer, bases, walk(inner.extent, 0),
                    parallel=want_parallel(size, math.prod(a.extent for a in outer)))
        if tail is not None:  # the end of the long inner axis that the blocks left over
            tail_start, tail_extent = tail
            body += nest(outer[:-1], bases, walk(tail_extent, tail_start), parallel=False,
                         name="j")
        return Kernel(kernel_name(self.kind, self.key), (*ins, out), (), tuple(body))

    def _axes(self) -> list[Axis]:
        out_strides = row_major(self.shape)
        per_input = []
        for s in self.inputs:
            padded = (1,) * (len(self.shape) - len(s)) + tuple(s)
            strides = row_major(padded)
            per_input.append([0 if d == 1 else st for d, st in zip(padded, strides, strict=True)])
        return [Axis(ext, (*(p[a] for p in per_input), out_strides[a]))
                for a, ext in enumerate(self.shape)]

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        values: list[np.ndarray] = []
        xs = [np.asarray(inputs[f"x{k}"], np.float64) for k in range(len(self.inputs))]

        def operand(x: str | float) -> np.ndarray | float:
            if isinstance(x, str):
                return xs[int(x[1:])] if x[0] == "x" else values[int(x[1:])]
            return float(x)

        for ins in self.program:
            args = [operand(a) for a in ins[1:]]
            with np.errstate(all="ignore"):
                values.append(np.asarray(_NUMPY[str(ins[0])](*args), np.float64))
        return np.broadcast_to(values[-1], self.shape).astype(np.float32)


def _check_shape(shape: object, what: str) -> None:
    if not isinstance(shape, tuple) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape
    ):
        raise GeneratedOpError(f"elementwise: {what} must be a tuple of positive ints, "
                               f"got {shape!r}")


def _is_literal(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _check_program(program: object, n_inputs: int) -> None:
    if not isinstance(program, tuple) or not program:
        raise GeneratedOpError("elementwise: the program needs at least one instruction")
    for n, ins in enumerate(program):
        if not isinstance(ins, tuple) or not ins or not isinstance(ins[0], str):
            raise GeneratedOpError(f"elementwise: instruction {n} is not (op, operand...): "
                                   f"{ins!r}")
        op, args = ins[0], ins[1:]
        arity = 1 if op in UNARY else 2 if op in BINARY else 1 + PARAMETRIC.get(op, -99)
        if arity < 0:
            raise GeneratedOpError(f"elementwise: unknown operation {op!r}")
        if len(args) != arity:
            raise GeneratedOpError(f"elementwise: {op} takes {arity} operands, got {len(args)}")
        literal_from = 1 if op in PARAMETRIC or op == "pow" else arity
        for k, a in enumerate(args):
            if k >= literal_from:
                if not _is_literal(a):
                    raise GeneratedOpError(f"elementwise: {op} operand {k} must be a float "
                                           f"literal, got {a!r}")
            elif not (_is_literal(a) or _is_ref(a, n, n_inputs)):
                raise GeneratedOpError(f"elementwise: instruction {n} operand {a!r} is not an "
                                       f"input x0..x{n_inputs - 1}, an earlier t0..t{n - 1} "
                                       "or a float literal")
        if all(_is_literal(a) for a in args[:literal_from]):
            raise GeneratedOpError(f"elementwise: instruction {n} has no tensor operand")


def _is_ref(a: object, n: int, n_inputs: int) -> bool:
    if not isinstance(a, str) or len(a) < 2 or a[0] not in "xt" or not a[1:].isdigit():
        return False
    return int(a[1:]) < (n_inputs if a[0] == "x" else n)


def _use_counts(program: tuple[Instruction, ...]) -> list[int]:
    counts = [0] * len(program)
    for ins in program:
        for a in ins[1:]:
            if isinstance(a, str) and a[0] == "t":
                counts[int(a[1:])] += 1
    return counts


def _emit(program: tuple[Instruction, ...], loads: list[Expr], temps: dict[str, Buffer],
          lane: Expr) -> tuple[list[Stmt], Expr]:
    """Stores for the shared temporaries, and the result expression."""
    values: list[Expr] = []
    stmts: list[Stmt] = []
    for n, ins in enumerate(program):
        op, args = str(ins[0]), ins[1:]

        def operand(a: str | float) -> Expr:
            if isinstance(a, str):
                return loads[int(a[1:])] if a[0] == "x" else values[int(a[1:])]
            return fconst(a)

        if op in PARAMETRIC or op == "pow":
            value = _BUILD[op](operand(args[0]), *(float(a) for a in args[1:]))
        else:
            value = _BUILD[op](*(operand(a) for a in args))
        name = f"t{n}"
        if name in temps:
            stmts.append(store(temps[name][lane], value))
            value = temps[name][lane]
        values.append(value)
    return stmts, values[-1]


def _clip(x: Expr, lo: float, hi: float) -> Expr:
    if lo > -math.inf:
        x = fmax(x, fconst(lo))
    if hi < math.inf:
        x = fmin(x, fconst(hi))
    return x


def _pow(x: Expr, e: float) -> Expr:
    if e == 1.0:
        return x
    if e == 0.5:
        return call("sqrt", x)
    if e == -1.0:
        return fconst(1.0) / x
    if e == int(e) and 2 <= e <= 4:
        out = x
        for _ in range(int(e) - 1):
            out = out * x
        return out
    return call("exp", call("log", x) * fconst(e))


_BUILD: dict[str, Callable[..., Expr]] = {
    "neg": lambda x: x * fconst(-1.0),
    "abs": lambda x: call("abs", x),
    "exp": lambda x: call("exp", x),
    "log": lambda x: call("log", x),
    "sqrt": lambda x: call("sqrt", x),
    "tanh": lambda x: call("tanh", x),
    "erf": lambda x: call("erf", x),
    "sigmoid": lambda x: call("sigmoid", x),
    "floor": lambda x: call("floor", x),
    "relu": lambda x: fmax(x, fconst(0.0)),
    "reciprocal": lambda x: fconst(1.0) / x,
    "gelu": lambda x: x * fconst(0.5) * (call("erf", x * fconst(_SQRT1_2)) + fconst(1.0)),
    "hardswish": lambda x: x * _clip(x * fconst(1.0 / 6.0) + fconst(0.5), 0.0, 1.0),
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "max": fmax,
    "min": fmin,
    "pow": _pow,
    "clip": _clip,
    "hardsigmoid": lambda x, alpha, beta: _clip(x * fconst(alpha) + fconst(beta), 0.0, 1.0),
    # max(x, 0) + alpha * min(x, 0): no lane-dependent select, so it stays SIMD
    "leakyrelu": lambda x, alpha: fmax(x, fconst(0.0)) + fmin(x, fconst(0.0)) * fconst(alpha),
}

_erf = np.vectorize(math.erf, otypes=[np.float64])
_NUMPY: dict[str, Callable[..., object]] = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "tanh": np.tanh, "erf": _erf, "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "floor": np.floor, "relu": lambda x: np.maximum(x, 0.0),
    "reciprocal": lambda x: 1.0 / x,
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x * _SQRT1_2)),
    "hardswish": lambda x: x * np.clip(x / 6.0 + 0.5, 0.0, 1.0),
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "max": np.maximum, "min": np.minimum, "pow": np.power,
    "clip": lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),
    "hardsigmoid": lambda x, a, b: np.clip(x * a + b, 0.0, 1.0),
    "leakyrelu": lambda x, a: np.where(x >= 0, x, x * a),
}
