"""The backend contract: ``check`` a task, ``compile`` it into a kernel bound to its inputs,
``run`` the timed protocol on it.

Backends are created inside the measuring process (a pool child), from a picklable
``BackendSpec``; nothing here is shared between processes.
"""

from __future__ import annotations

import collections
import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from schedule_templates.errors import InvalidConfigError
from schedule_templates.protocol import ClaimItem, Decoded
from schedule_templates.records import MeasureOptions
from workers.backends.timing import time_protocol
from workers.compile_cache import CompileKey
from workers.hardware import llc_bytes

if TYPE_CHECKING:
    from schedule_templates.workloads import Workload


class BoundKernel(Protocol):
    """A compiled kernel with its buffers bound: ``run`` executes it once on them."""

    #: length of the reduction behind one output element; scales the correctness tolerance
    reduction_length: int

    def run(self) -> None: ...

    @property
    def output(self) -> np.ndarray: ...

    def expected(self) -> np.ndarray:
        """The reference answer for the bound inputs."""
        ...

    def close(self) -> None: ...


class Backend(ABC):
    """Turns a task into timed costs. Expected failures raise the ``schedule_templates`` errors
    (InvalidConfigError -> instantiation, CodegenError -> compile); the runner classifies them."""

    name: ClassVar[str]
    #: its timed runs share the machine with other processes, so the measuring process checks
    #: that the machine is quiet around them (``workers.measure.hygiene``); a simulation is not
    probes_quiet: ClassVar[bool] = True

    def check(self, task: ClaimItem) -> Decoded | None:
        """Validate the task against its template's space before anything is built."""
        return resolve(task)

    @abstractmethod
    def compile(self, task: ClaimItem, resolved: Decoded | None) -> BoundKernel:
        """Build the kernel and bind it to fresh inputs (packing constants is untimed)."""

    def compile_cached(self, task: ClaimItem, resolved: Decoded | None, code: bytes | None
                       ) -> tuple[BoundKernel, bytes | None]:
        """``compile``, loading ``code`` (the worker's cached build of this task) when given;
        returns the kernel and freshly built code for the cache (None: nothing to keep). By
        default nothing is cached: ``cache_key`` says None."""
        return self.compile(task, resolved), None

    @classmethod
    def cache_key(cls, task: ClaimItem, options: Mapping[str, Any]) -> CompileKey | None:
        """The key of this task's built code in the worker's compile cache, or None when it is
        not cached. Called in the worker's main process, without creating the backend."""
        return None

    def run(self, kernel: BoundKernel, options: MeasureOptions) -> tuple[float, ...]:
        """The timed protocol: seconds of one run per sample."""
        flush = self.flush_bytes if options.flush_cache else 0
        return time_protocol(kernel.run, options, flush_bytes=flush)

    @functools.cached_property
    def flush_bytes(self) -> int:
        """A cache flush writes twice the last-level cache."""
        return 2 * llc_bytes()

    @classmethod
    def declared_device_class(cls, options: dict[str, Any]) -> str | None:
        """The device class id this backend measures as when it is not the host's hardware
        (a simulation), read from its options without creating it; None: detect it."""
        return None

    def healthy(self) -> bool:
        """False when a candidate left the backend unusable (a GPU context after a launch
        fault): the measuring process is then replaced before the next candidate."""
        return True

    def measure_peak(self, threads: int) -> float | None:
        """The device's fp32 peak in GFLOPS on ``threads`` threads, measured by the backend's own
        code, or None when it cannot tell. Called between batches, never while timing."""
        return None

    def close(self) -> None:  # noqa: B027 (optional hook, most backends hold nothing)
        """Free what the backend holds across tasks (nothing by default)."""


def resolve(task: ClaimItem) -> Decoded:
    """Decode the task's candidate against this worker's templates (the worker's one check of
    what the server sent) and refuse a template that generates code for another target."""
    decoded = task.candidate.decode()
    if task.target.kind != decoded.template.target_kind:
        raise InvalidConfigError(
            f"template {decoded.template.name} generates {decoded.template.target_kind} code, "
            f"not {str(task.target)!r}"
        )
    return decoded


def reduction_length(workload: Workload) -> int:
    """Multiply-adds behind one output element (1 for element-wise operators)."""
    outputs = math.prod(workload.output_shape())
    return max(1, workload.flops() // max(1, 2 * outputs))


#: inputs are drawn from this seed so that every worker checks against the same reference
INPUT_SEED = 0


class Operands:
    """A workload's inputs and, computed on first use, its reference output."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.inputs = workload.make_inputs(INPUT_SEED)
        self._reference: np.ndarray | None = None

    def reference(self) -> np.ndarray:
        if self._reference is None:
            self._reference = np.asarray(self.workload.reference(self.inputs))
        return self._reference


class OperandCache:
    """The operands of the ``size`` workloads used last (inputs are drawn once per workload)."""

    def __init__(self, size: int) -> None:
        self._size = max(1, size)
        self._entries: collections.OrderedDict[str, Operands] = collections.OrderedDict()

    def get(self, workload: Workload) -> Operands:
        key = workload.key
        found = self._entries.pop(key, None) or Operands(workload)
        self._entries[key] = found
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)
        return found

    def clear(self) -> None:
        self._entries.clear()
