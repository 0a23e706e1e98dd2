"""Which cores time a kernel and which build the next candidates, by CPU affinity.

A timed run must have its cores to itself, yet on a CPU worker building a candidate (code
generation and LLVM) costs more than timing one. So the cores are split while a kernel is
timed: its process is pinned to the first ``threads`` cores of the worker's set, and every
other measuring process (building or checking) to the rest, with ``os.sched_setaffinity`` set
by the parent before it lets the timed run start. While nothing is timed every process may use
every core. A kernel that needs every core is timed with nothing else building, as before.

Builds are also kept off the timing cores' SMT siblings (hyperthreads of the same physical
core share its execution units and caches); where that leaves no core, nothing overlaps.
Affinity is set on a child's main thread, which builds and runs the kernel: its BLAS is single
threaded (``pool.CHILD_ENVIRONMENT``), and a single-threaded kernel runs on that thread. Off
Linux nothing is pinned and no build overlaps a timed run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

SYS_CPU = Path("/sys/devices/system/cpu")


@dataclasses.dataclass(frozen=True)
class CoreLayout:
    """The cores the worker may use, in order; timed runs take them from the front."""

    cores: tuple[int, ...]
    #: each core's SMT siblings, itself included, in the order of ``cores`` (empty: unknown)
    siblings: tuple[frozenset[int], ...] = ()

    @classmethod
    def of_this_process(cls, sys_cpu: Path = SYS_CPU) -> CoreLayout:
        if not hasattr(os, "sched_getaffinity"):
            return cls(())
        cores = tuple(sorted(os.sched_getaffinity(0)))
        return cls(cores, tuple(read_siblings(c, sys_cpu) for c in cores))

    def can_pin(self) -> bool:
        return bool(self.cores) and hasattr(os, "sched_setaffinity")

    def overlaps(self, threads: int) -> bool:
        """Whether others may build while a ``threads``-thread kernel is timed."""
        return self.can_pin() and bool(self.building(threads))

    def timing(self, threads: int) -> frozenset[int]:
        return frozenset(self.cores[: max(1, threads)])

    def building(self, threads: int) -> frozenset[int]:
        """The cores left to builds while a ``threads``-thread kernel is timed: neither a
        timing core nor an SMT sibling of one."""
        timing = self.timing(threads)
        taken = set(timing)
        for i, core in enumerate(self.cores):
            if core in timing and i < len(self.siblings):
                taken |= self.siblings[i]
        return frozenset(c for c in self.cores if c not in taken)

    def all(self) -> frozenset[int]:
        return frozenset(self.cores)


def read_siblings(cpu: int, sys_cpu: Path = SYS_CPU) -> frozenset[int]:
    """The SMT siblings of ``cpu`` (itself included) as the kernel lists them; just ``cpu``
    where the list cannot be read."""
    path = sys_cpu / f"cpu{cpu}" / "topology" / "thread_siblings_list"
    try:
        return parse_cpu_list(path.read_text()) | {cpu}
    except (OSError, ValueError):
        return frozenset({cpu})


def parse_cpu_list(text: str) -> frozenset[int]:
    """``"0,8"`` or ``"0-1,4"`` -> the cpu numbers (the kernel's list format)."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


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
