"""Byte dot products in plain LLVM integer arithmetic, for the host form of GPU kernels.

``dp4a`` is CUDA's ``dp4a.u32.s32``: per 32-bit lane, the accumulator plus the four products
of the first operand's unsigned bytes with the second's signed bytes (exact in int32 for the
reductions a kernel runs; wrapping otherwise, as on the GPU). ``bytes4`` packs the low bytes of
four values into one word, the first in the lowest byte (little-endian, as the GPU reads a word
of four adjacent bytes). Both work on scalars and on vectors of any width, so the serial host
run of a GPU kernel (``ir/gpu.py``) computes exactly what the device does.
"""

from __future__ import annotations

from llvmlite import ir

_I32 = ir.IntType(32)
_I8 = ir.IntType(8)


def _lanes(value: ir.Value) -> int:
    return value.type.count if isinstance(value.type, ir.VectorType) else 0


def _splat(value: int, lanes: int) -> ir.Constant:
    return ir.Constant(ir.VectorType(_I32, lanes), [value] * lanes) if lanes else ir.Constant(
        _I32, value)


def emit_dp4a(b: ir.IRBuilder, acc: ir.Value, x: ir.Value, y: ir.Value) -> ir.Value:
    """``acc + sum_j u8(x.byte[j]) * s8(y.byte[j])`` per 32-bit lane."""
    lanes = _lanes(acc)
    width = max(1, lanes)
    byte_vector = ir.VectorType(_I8, 4 * width)
    wide = ir.VectorType(_I32, 4 * width)

    def as_bytes(word: ir.Value) -> ir.Value:
        if lanes == 0:  # a scalar word: make it a one-lane vector first
            word = b.insert_element(ir.Constant(ir.VectorType(_I32, 1), None), word,
                                    ir.Constant(_I32, 0))
        return b.bitcast(word, byte_vector)

    products = b.mul(b.zext(as_bytes(x), wide), b.sext(as_bytes(y), wide))
    total = acc
    for j in range(4):  # byte j of every lane, then the four partial sums in order
        picked: ir.Value
        if lanes == 0:
            picked = b.extract_element(products, ir.Constant(_I32, j))
        else:
            mask = ir.Constant(ir.VectorType(_I32, lanes), [4 * i + j for i in range(lanes)])
            picked = b.shuffle_vector(products, products, mask)
        total = b.add(total, picked)
    return total


def emit_bytes4(b: ir.IRBuilder, *values: ir.Value) -> ir.Value:
    """``(v0 & 255) | (v1 & 255) << 8 | (v2 & 255) << 16 | v3 << 24`` per lane."""
    lanes = _lanes(values[0])
    word: ir.Value | None = None
    for j, value in enumerate(values):
        part = value if j == 3 else b.and_(value, _splat(255, lanes))
        if j:
            part = b.shl(part, _splat(8 * j, lanes))
        word = part if word is None else b.or_(word, part)
    assert word is not None
    return word
