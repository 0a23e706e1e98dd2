"""The NVIDIA GPU backend: lower with the worker's own templates, generate CUDA C, compile it
with pycuda (nvcc) for this GPU's architecture, check against numpy, time with CUDA events.

pycuda is imported on first use (``pip install 'tuner[cuda]'``); a CPU worker never needs it.
One backend owns one CUDA context on one device for its lifetime (a measuring child process).
Device facts (``device_facts``) read attributes without creating a context, for registration.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from types import ModuleType
from typing import Any

import numpy as np

from schedule_templates.codegen.cuda_c import CudaKernel, generate_cuda
from schedule_templates.errors import DeviceCompileError, InvalidConfigError
from schedule_templates.protocol import ClaimItem, Decoded, Target
from schedule_templates.records import MeasureOptions
from schedule_templates.runtime import NUMPY_DTYPES
from schedule_templates.space import ConfigSpace
from workers.backends.base import (
    Backend,
    BoundKernel,
    OperandCache,
    Operands,
    reduction_length,
    resolve,
)
from workers.backends.timing import grow_number
from workers.errors import BackendError

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'tuner[cuda]' (pycuda, built against this machine's CUDA)"
#: device attribute -> key of the worker's report (the keys templates read as ``device``)
_LIMITS = {
    "MAX_THREADS_PER_BLOCK": "max_threads_per_block",
    "MAX_SHARED_MEMORY_PER_BLOCK": "max_shared_memory_per_block",
    "MAX_REGISTERS_PER_BLOCK": "max_registers_per_block",
    "WARP_SIZE": "warp_size",
    "MULTIPROCESSOR_COUNT": "multiprocessor_count",
    "L2_CACHE_SIZE": "l2_cache_bytes",
    "CLOCK_RATE": "clock_khz",
}


def import_driver() -> ModuleType:
    """``pycuda.driver``, initialised; BackendError with an install hint when missing."""
    try:
        import pycuda.driver as drv
    except ImportError as e:
        raise BackendError(f"the cuda backend needs pycuda: {INSTALL_HINT}") from e
    try:
        drv.init()
    except Exception as e:  # pycuda.driver.Error: no driver, no device
        raise BackendError(f"CUDA is not usable here: {e}") from e
    return drv


def device_facts(drv: ModuleType, ordinal: int = 0) -> dict[str, Any]:
    """What registration reports about one GPU: its name, architecture and launch limits."""
    device = drv.Device(ordinal)
    major, minor = device.compute_capability()
    facts: dict[str, Any] = {
        "name": device.name(),
        "ordinal": ordinal,
        "compute_capability": f"sm_{major}{minor}",
        "memory_bytes": int(device.total_memory()),
    }
    for attribute, key in _LIMITS.items():
        facts[key] = int(device.get_attribute(getattr(drv.device_attribute, attribute)))
    return facts


def gpu_facts(ordinal: int = 0) -> dict[str, Any]:
    """``device_facts`` of this machine's GPU, importing pycuda on the way."""
    return device_facts(import_driver(), ordinal)


def target_for(facts: dict[str, Any], target: Target | None = None) -> Target:
    """``target`` (``cuda`` when None) with this GPU's architecture: a CUDA worker resolves it
    from its device when it starts, so its records name the architecture they were measured
    on; a job's target usually names none (``Target.serves`` matches the two)."""
    return (target or Target("cuda")).with_option("-arch", str(facts["compute_capability"]))


@dataclasses.dataclass
class _CudaKernel:
    """A compiled kernel bound to device buffers (inputs uploaded once, output reused)."""

    drv: ModuleType
    module: Any
    function: Any
    cuda: CudaKernel
    allocations: list[Any]
    output_index: int
    output_shape: tuple[int, ...]
    output_dtype: type[np.generic]
    operands: Operands
    reduction_length: int

    def launch(self) -> None:
        self.function.prepared_call(self.cuda.grid, self.cuda.block,
                                    *[int(a) for a in self.allocations])

    def run(self) -> None:
        self.launch()
        self.drv.Context.synchronize()

    @property
    def output(self) -> np.ndarray:
        host = np.empty(math.prod(self.output_shape), dtype=self.output_dtype)
        self.drv.memcpy_dtoh(host, self.allocations[self.output_index])
        return host.reshape(self.output_shape)

    def expected(self) -> np.ndarray:
        return self.operands.reference()

    def close(self) -> None:
        for allocation in self.allocations:
            allocation.free()
        self.allocations = []


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self, device: int = 0, cached_workloads: int = 4,
                 nvcc_options: tuple[str, ...] = ("-O3",)) -> None:
        self._drv = import_driver()
        self.facts = device_facts(self._drv, device)
        self.arch = str(self.facts["compute_capability"])
        self._context = self._drv.Device(device).make_context()
        self._nvcc_options = list(nvcc_options)
        self._operands = OperandCache(cached_workloads)
        #: spaces within this GPU's limits, per (template, workload): a claim is many configs
        #: of one task, and the facts never change for this backend
        self._spaces: dict[tuple[str, str], ConfigSpace] = {}

    def check(self, task: ClaimItem) -> Decoded:
        """The common checks, then this GPU's own limits and architecture."""
        resolved = resolve(task)
        arch = task.target.option("-arch")
        if arch is not None and arch != self.arch:
            raise InvalidConfigError(f"the task targets {arch}, this GPU is {self.arch}")
        space = self._space(resolved)
        if not space.is_valid(resolved.config.index):
            raise InvalidConfigError(
                f"config {resolved.config.index} exceeds the limits of {self.facts['name']}")
        return resolved

    def _space(self, resolved: Decoded) -> ConfigSpace:
        key = (resolved.template.name, resolved.workload.key)
        space = self._spaces.get(key)
        if space is None:
            if len(self._spaces) >= 64:
                self._spaces.clear()
            space = self._spaces[key] = resolved.template.space(resolved.workload, self.facts)
        return space

    def compile(self, task: ClaimItem, resolved: Decoded | None) -> BoundKernel:
        if resolved is None:
            resolved = self.check(task)
        kernel = resolved.template.lower(resolved.workload, resolved.config)
        cuda = generate_cuda(kernel)
        module = self._build(cuda)
        operands = self._operands.get(resolved.workload)
        packed = resolved.template.pack(resolved.workload, resolved.config, operands.inputs)
        allocations: list[Any] = []
        try:
            for buf in kernel.params[:-1]:
                array = np.ascontiguousarray(packed[buf.name], dtype=NUMPY_DTYPES[buf.dtype]
                                             ).reshape(-1)
                if array.size != buf.size:
                    raise InvalidConfigError(
                        f"argument {buf.name} has {array.size} elements, kernel expects "
                        f"{buf.size}")
                allocations.append(self._drv.to_device(_padded(array, buf.slack)))
            for buf in (kernel.output, *kernel.workspace):
                size = np.dtype(NUMPY_DTYPES[buf.dtype]).itemsize * (buf.size + buf.slack)
                allocation = self._drv.mem_alloc(size)
                self._drv.memset_d8(allocation, 0, size)
                allocations.append(allocation)
        except BaseException:
            for allocation in allocations:
                allocation.free()
            raise
        function = module.get_function(cuda.name)
        function.prepare("P" * len(allocations))
        return _CudaKernel(self._drv, module, function, cuda, allocations,
                           len(kernel.params) - 1, resolved.workload.output_shape(),
                           NUMPY_DTYPES[kernel.output.dtype], operands,
                           reduction_length(resolved.workload))

    def run(self, kernel: BoundKernel, options: MeasureOptions) -> tuple[float, ...]:
        """The run protocol timed by CUDA events around ``number`` back-to-back launches."""
        assert isinstance(kernel, _CudaKernel)
        start, end = self._drv.Event(), self._drv.Event()
        kernel.run()  # warm-up
        number = max(1, options.number)
        min_s = max(0.0, options.min_repeat_ms) / 1000.0
        costs: list[float] = []
        while len(costs) < max(1, options.repeat):
            start.record()
            for _ in range(number):
                kernel.launch()
            end.record()
            end.synchronize()
            elapsed = end.time_since(start) / 1000.0
            if elapsed < min_s and not costs:
                number = grow_number(number, elapsed, min_s)
                continue
            costs.append(elapsed / number)
        return tuple(costs)

    def healthy(self) -> bool:
        """A launch fault (illegal address, trap) is sticky: every later call in this context
        fails, so the measuring process must be replaced."""
        try:
            self._drv.Context.synchronize()
        except Exception as e:  # pycuda.driver.Error and its subclasses
            logger.warning("the CUDA context is unusable after the last candidate: %s", e)
            return False
        return True

    def close(self) -> None:
        context = getattr(self, "_context", None)
        if context is not None:
            self._operands.clear()
            context.pop()
            context.detach()
            self._context = None

    def _build(self, cuda: CudaKernel) -> Any:
        from pycuda.compiler import SourceModule

        # pycuda raises nvcc failures as pycuda.driver.CompileError
        compile_error = self._drv.CompileError
        try:
            return SourceModule(cuda.source, arch=self.arch, no_extern_c=True,
                                options=self._nvcc_options)
        except compile_error as e:
            raise DeviceCompileError(f"nvcc failed for {cuda.name}: {e}") from e


def _padded(array: np.ndarray, slack: int) -> np.ndarray:
    return np.concatenate([array, np.zeros(slack, array.dtype)]) if slack else array
