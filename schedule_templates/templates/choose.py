"""Helpers templates share to pick default tile sizes."""

from __future__ import annotations

from schedule_templates.space import divisors

#: fp32 lanes of one AVX-512 register; the register budget below is counted in these
LANES = 16
#: vector registers available for accumulators (32 zmm minus loads and broadcasts)
ACC_REGISTERS = 28


def vregs(width: int) -> int:
    return -(-width // LANES)


def largest_divisor(n: int, limit: int, prefer: tuple[int, ...] = ()) -> int:
    """The first of ``prefer`` dividing n and <= limit, else the largest divisor <= limit."""
    for p in prefer:
        if p <= limit and n % p == 0:
            return p
    return max(d for d in divisors(n) if d <= limit)


def three_way(extent: int, inner: int, middle_target: int) -> tuple[int, int, int]:
    """(outer, middle, inner) with middle*inner near ``middle_target`` and dividing extent."""
    rest = extent // inner
    middle = largest_divisor(rest, max(1, middle_target // inner))
    return rest // middle, middle, inner


def block_split(extent: int, inner: int, block_target: int) -> tuple[int, int, int]:
    """(outer, middle, inner) with ``middle*inner`` near ``block_target``; when no divisor
    comes within half of it (a prime extent, say) the next larger one is taken, at worst one
    block, rather than slivers: a sliver of a reduction stores and reloads its partial sums,
    a sliver of rows rereads the other operand from memory once per row."""
    rest = extent // inner
    target = min(rest, max(1, block_target // inner))
    below = max(d for d in divisors(rest) if d <= target)
    middle = below if 2 * below >= target else min(d for d in divisors(rest) if d >= target)
    return rest // middle, middle, inner
