"""Where every activation buffer of a model lives: offsets into one arena, planned at load time.

A model's activations are short-lived: most kernel outputs are read by the next layer or two and
never again. Giving each its own allocation (what the step-by-step runner did) makes the
working set the sum of every buffer in the model; placing buffers whose lifetimes do not overlap
at the same offsets makes it roughly the largest set of buffers alive at one time, which keeps
activations in cache between layers and lets a C program allocate one block at load.

The plan is the classic greedy one (largest buffer first, each at the lowest 64-byte aligned
offset where it overlaps in memory no placed buffer it overlaps in time), computed once ahead
of time from step indices: a buffer is live from the step that writes it to the last step that
reads it, both inclusive, so a buffer never shares memory with one its own step reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

ALIGN_BYTES = 64


@dataclasses.dataclass(frozen=True)
class BufferRequest:
    """One buffer: ``size`` bytes, live from step ``first`` to step ``last`` (inclusive)."""

    name: str
    size: int
    first: int
    last: int

    def __post_init__(self) -> None:
        if self.size < 0 or self.last < self.first:
            raise ValueError(f"buffer {self.name}: size {self.size}, live {self.first}.."
                             f"{self.last} is not a buffer")

    def overlaps_in_time(self, other: BufferRequest) -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Byte offsets into one arena of ``arena_bytes``; ``total_bytes`` is what separate
    (aligned) allocations would take."""

    offsets: dict[str, int]
    sizes: dict[str, int]
    arena_bytes: int
    total_bytes: int

    def summary(self) -> dict[str, int | float]:
        saved = 1 - self.arena_bytes / self.total_bytes if self.total_bytes else 0.0
        return {"buffers": len(self.offsets), "arena_bytes": self.arena_bytes,
                "sum_of_buffers_bytes": self.total_bytes, "saved_fraction": round(saved, 4)}


def aligned(size: int, alignment: int = ALIGN_BYTES) -> int:
    return -(-size // alignment) * alignment


def plan_memory(requests: Sequence[BufferRequest]) -> MemoryPlan:
    """Offsets for ``requests`` (unique names) such that no two buffers live at the same step
    share a byte."""
    names = [r.name for r in requests]
    if len(set(names)) != len(names):
        raise ValueError("buffer names must be unique")
    order = sorted(requests, key=lambda r: (-aligned(r.size), r.first, r.name))
    placed: list[tuple[int, int, BufferRequest]] = []  # (offset, aligned size, request)
    offsets: dict[str, int] = {}
    for request in order:
        offset = _lowest_fit(request, placed)
        placed.append((offset, aligned(request.size), request))
        offsets[request.name] = offset
    arena = max((offset + size for offset, size, _ in placed), default=0)
    return MemoryPlan(offsets, {r.name: r.size for r in requests}, arena,
                      sum(aligned(r.size) for r in requests))


def _lowest_fit(request: BufferRequest, placed: list[tuple[int, int, BufferRequest]]) -> int:
    """The lowest aligned offset where ``request`` fits between the placed buffers it overlaps
    in time (placed ones sorted by offset; gaps are scanned left to right)."""
    size = aligned(request.size)
    offset = 0
    for start, length, other in sorted(placed, key=lambda p: p[0]):
        if not request.overlaps_in_time(other):
            continue
        if start >= offset + size:  # the gap before this buffer is large enough
            break
        offset = max(offset, start + length)
    return offset


def check_plan(plan: MemoryPlan, requests: Sequence[BufferRequest]) -> None:
    """Raise if two buffers live at the same step share memory (tests and a load-time check)."""
    spans = [(plan.offsets[r.name], plan.offsets[r.name] + r.size, r) for r in requests]
    for i, (a0, a1, a) in enumerate(spans):
        if a0 % ALIGN_BYTES or a1 > plan.arena_bytes:
            raise AssertionError(f"buffer {a.name} at {a0}..{a1} is misplaced")
        for b0, b1, b in spans[i + 1:]:
            if a.overlaps_in_time(b) and a0 < b1 and b0 < a1 and a.size and b.size:
                raise AssertionError(f"buffers {a.name} and {b.name} are live together and "
                                     f"share memory ({a0}..{a1} and {b0}..{b1})")
