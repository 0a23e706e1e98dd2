"""x86 integer dot products that LLVM has no portable form for, emitted on whole vectors.

``pmaddwd`` is the int8 path of hosts without AVX-512 VNNI: each 32-bit lane of its two
operands holds two signed 16-bit values, and ``vpmaddwd`` (AVX2) gives ``lo*lo + hi*hi`` per
lane as an exact int32 (u8 and s8 values widened to 16 bits cannot overflow it: the one case
that wraps is -32768 * -32768 twice); the sum is then added to the accumulator. The
instruction works on 8 lanes, so a vector of ``8 * n`` lanes is split into n calls and the
results joined again (LLVM keeps them in separate ymm registers anyway).

``pmaddubsw`` is the byte form the peers' AVX2 kernels use: ``vpmaddubsw`` multiplies the u8
bytes of its first operand by the s8 bytes of its second and adds neighbours into 16-bit lanes
(saturating), and ``vpmaddwd`` against ones adds neighbouring 16-bit lanes into each 32-bit
lane: VNNI's arithmetic, 4 products per lane, on bytes as they lie. It is exact only while no
16-bit pair sum saturates, which holds when every weight is within [-64, 64] (255 * 128 =
32640): the weights a caller promises (``weights=narrow``) and a template checks at pack time.
"""

from __future__ import annotations

from llvmlite import ir

from schedule_templates.errors import CodegenError

_I32 = ir.IntType(32)
_I16 = ir.IntType(16)
_PMADDWD = "llvm.x86.avx2.pmadd.wd"
_PMADDUBSW = "llvm.x86.avx2.pmadd.ub.sw"
_WIDTH = 8  # int32 lanes of one vpmaddwd (a ymm register)


def _declared(module: ir.Module, name: str, ret: ir.Type, operand: ir.Type) -> ir.Function:
    existing = module.globals.get(name)
    return existing if isinstance(existing, ir.Function) else ir.Function(
        module, ir.FunctionType(ret, [operand, operand]), name=name)


def _ymm_parts(b: ir.IRBuilder, fn: str, acc: ir.Value, x: ir.Value, y: ir.Value
               ) -> list[tuple[ir.Value, ir.Value]]:
    """``x`` and ``y`` cut into ymm-wide pieces of ``_WIDTH`` 32-bit lanes."""
    ty = acc.type
    lanes = ty.count if isinstance(ty, ir.VectorType) else 0
    if lanes == 0 or lanes % _WIDTH:
        raise CodegenError(f"{fn} works on multiples of {_WIDTH} lanes, here {lanes or 1}: "
                           f"put it under a vectorized loop of a multiple of {_WIDTH}")
    if lanes == _WIDTH:
        return [(x, y)]
    parts = []
    for start in range(0, lanes, _WIDTH):
        mask = ir.Constant(ir.VectorType(_I32, _WIDTH), list(range(start, start + _WIDTH)))
        parts.append((b.shuffle_vector(x, x, mask), b.shuffle_vector(y, y, mask)))
    return parts


def emit_pmaddwd(b: ir.IRBuilder, module: ir.Module, acc: ir.Value, x: ir.Value,
                 y: ir.Value) -> ir.Value:
    """``acc + x.lo * y.lo + x.hi * y.hi`` per 32-bit lane (16-bit halves, signed)."""
    halves = ir.VectorType(_I16, 2 * _WIDTH)
    callee = _declared(module, _PMADDWD, ir.VectorType(_I32, _WIDTH), halves)
    parts = [b.call(callee, [b.bitcast(xs, halves), b.bitcast(ys, halves)])
             for xs, ys in _ymm_parts(b, "pmaddwd", acc, x, y)]
    return b.add(acc, _joined(b, parts))


def emit_pmaddubsw(b: ir.IRBuilder, module: ir.Module, acc: ir.Value, x: ir.Value,
                   y: ir.Value) -> ir.Value:
    """``acc`` plus the 4 products (u8 of ``x``) * (s8 of ``y``) of each 32-bit lane, through
    16-bit pair sums (exact while none saturates: weights within [-64, 64])."""
    halves = ir.VectorType(_I16, 2 * _WIDTH)
    quads = ir.VectorType(ir.IntType(8), 4 * _WIDTH)
    pairs = _declared(module, _PMADDUBSW, halves, quads)
    widen = _declared(module, _PMADDWD, ir.VectorType(_I32, _WIDTH), halves)
    ones = ir.Constant(halves, [1] * (2 * _WIDTH))
    parts = [b.call(widen, [b.call(pairs, [b.bitcast(xs, quads), b.bitcast(ys, quads)]), ones])
             for xs, ys in _ymm_parts(b, "pmaddubsw", acc, x, y)]
    return b.add(acc, _joined(b, parts))


def _joined(b: ir.IRBuilder, parts: list[ir.Value]) -> ir.Value:
    while len(parts) > 1:  # join neighbours until one vector of all the lanes is left
        width = parts[0].type.count
        mask = ir.Constant(ir.VectorType(_I32, 2 * width), list(range(2 * width)))
        parts = [b.shuffle_vector(parts[i], parts[i + 1], mask)
                 for i in range(0, len(parts), 2)]
    return parts[0]
