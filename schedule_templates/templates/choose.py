"""Helpers templates share to pick default tile sizes."""

from __future__ import annotations

import dataclasses
import functools

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


#: register-tile widths a conv's output rows and columns are tiled by
SPATIAL_TILES = (4, 6, 7, 8)


def padded_spatial(extent: int) -> int:
    """The output rows (or columns) a conv computes for an axis of ``extent``: itself when it
    is at most 8 or one of ``SPATIAL_TILES`` divides it (ResNet's 112/56/28/14/7: stored
    configs of such shapes keep their meaning), else the next extent one of them divides
    (SqueezeNet's 111/55/27/13 become 112/56/28/14: their divisors forced 1-, 3- or full-row
    tiles). A template's last tile then overlaps its neighbour or computes outputs it does
    not store."""
    if extent <= max(SPATIAL_TILES):
        return extent
    padded = extent
    while all(padded % d for d in SPATIAL_TILES):
        padded += 1
    return padded


@dataclasses.dataclass(frozen=True)
class RegisterFile:
    """What a default register tile may hold: ``accumulators`` vector registers of ``lanes``
    fp32 lanes each."""

    lanes: int
    accumulators: int

    def vregs(self, width: int) -> int:
        return -(-width // self.lanes)


#: 32 zmm registers, the budget the defaults were measured with
AVX512 = RegisterFile(LANES, ACC_REGISTERS)
#: 16 ymm (or xmm) registers: 14 accumulators, a weight vector and a broadcast (a 14-pixel by
#: 32-channel tile, 28 zmm, is 56 ymm: spilled, a 1x1 conv ran at half the speed of 7 x 16)
NARROW_ACCUMULATORS = 14


@functools.cache
def host_registers() -> RegisterFile:
    """The register file of this host's widest vectors (the JIT compiles for the host)."""
    from schedule_templates.codegen.llvm_jit import host_vector_lanes

    lanes = host_vector_lanes()
    return AVX512 if lanes >= LANES else RegisterFile(lanes, NARROW_ACCUMULATORS)
