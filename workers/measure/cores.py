"""Which cores time a kernel and which build the next candidates, by CPU affinity.

A timed run must have its cores to itself, yet on a CPU worker building a candidate (code
generation and LLVM) costs more than timing one. So the cores are split while a kernel is
timed: its process is pinned to the first ``threads`` cores of the worker's set, and every
other measuring process (building or checking) to the rest, with ``os.sched_setaffinity`` set
by the parent before it lets the timed run start. While nothing is timed every process may use
every core. A kernel that needs every core is timed with nothing else building, as before.

Affinity is set on a child's main thread, which builds and runs the kernel: its BLAS is single
threaded (``pool.CHILD_ENVIRONMENT``), and a single-threaded kernel runs on that thread. Off
Linux nothing is pinned and no build overlaps a timed run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator


@dataclasses.dataclass(frozen=True)
class CoreLayout:
    """The cores the worker may use, in order; timed runs take them from the front."""

    cores: tuple[int, ...]

    @classmethod
    def of_this_process(cls) -> CoreLayout:
        if not hasattr(os, "sched_getaffinity"):
            return cls(())
        return cls(tuple(sorted(os.sched_getaffinity(0))))

    def can_pin(self) -> bool:
        return bool(self.cores) and hasattr(os, "sched_setaffinity")

    def overlaps(self, threads: int) -> bool:
        """Whether others may build while a ``threads``-thread kernel is timed."""
        return self.can_pin() and max(1, threads) < len(self.cores)

    def timing(self, threads: int) -> frozenset[int]:
        return frozenset(self.cores[: max(1, threads)])

    def building(self, threads: int) -> frozenset[int]:
        """The cores left to builds while a ``threads``-thread kernel is timed."""
        return frozenset(self.cores[max(1, threads):])

    def all(self) -> frozenset[int]:
        return frozenset(self.cores)


def pin(pid: int, cpus: frozenset[int]) -> bool:
    """Restrict ``pid`` (its main thread; 0: the calling thread) to ``cpus``; False when that
    is not possible (no such process any more, or not Linux)."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return False
    with contextlib.suppress(OSError):
        os.sched_setaffinity(pid, cpus)
        return True
    return False


@contextlib.contextmanager
def pinned(cpus: frozenset[int]) -> Iterator[None]:
    """The calling thread (and the threads it starts meanwhile) on ``cpus``, then as before."""
    before = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    pin(0, cpus)
    try:
        yield
    finally:
        if before is not None:
            pin(0, before)
