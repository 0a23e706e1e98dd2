"""x86 integer dot products that LLVM has no portable form for, emitted on whole vectors.

``pmaddwd`` is the int8 path of hosts without AVX-512 VNNI: each 32-bit lane of its two
operands holds two signed 16-bit values, and ``vpmaddwd`` (AVX2) gives ``lo*lo + hi*hi`` per
lane as an exact int32 (u8 and s8 values widened to 16 bits cannot overflow it: the one case
that wraps is -32768 * -32768 twice); the sum is then added to the accumulator. The
instruction works on 8 lanes, so a vector of ``8 * n`` lanes is split into n calls and the
results joined again (LLVM keeps them in separate ymm registers anyway).
"""

from __future__ import annotations

from llvmlite import ir

from schedule_templates.errors import CodegenError

_I32 = ir.IntType(32)
_I16 = ir.IntType(16)
_PMADDWD = "llvm.x86.avx2.pmadd.wd"
_WIDTH = 8  # int32 lanes of one vpmaddwd (a ymm register)


def emit_pmaddwd(b: ir.IRBuilder, module: ir.Module, acc: ir.Value, x: ir.Value,
                 y: ir.Value) -> ir.Value:
    """``acc + x.lo * y.lo + x.hi * y.hi`` per 32-bit lane (16-bit halves, signed)."""
    ty = acc.type
    lanes = ty.count if isinstance(ty, ir.VectorType) else 0
    if lanes == 0 or lanes % _WIDTH:
        raise CodegenError(f"pmaddwd works on multiples of {_WIDTH} lanes, here {lanes or 1}: "
                           f"put it under a vectorized loop of a multiple of {_WIDTH}")
    halves = ir.VectorType(_I16, 2 * _WIDTH)
    existing = module.globals.get(_PMADDWD)
    callee = existing if isinstance(existing, ir.Function) else ir.Function(
        module, ir.FunctionType(ir.VectorType(_I32, _WIDTH), [halves, halves]), name=_PMADDWD)
    parts: list[ir.Value] = []
    for start in range(0, lanes, _WIDTH):
        if lanes == _WIDTH:
            xs, ys = x, y
        else:
            mask = ir.Constant(ir.VectorType(_I32, _WIDTH), list(range(start, start + _WIDTH)))
            xs, ys = b.shuffle_vector(x, x, mask), b.shuffle_vector(y, y, mask)
        parts.append(b.call(callee, [b.bitcast(xs, halves), b.bitcast(ys, halves)]))
    while len(parts) > 1:  # join neighbours until one vector of all the lanes is left
        width = parts[0].type.count
        mask = ir.Constant(ir.VectorType(_I32, 2 * width), list(range(2 * width)))
        parts = [b.shuffle_vector(parts[i], parts[i + 1], mask)
                 for i in range(0, len(parts), 2)]
    return b.add(acc, parts[0])
