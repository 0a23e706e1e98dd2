"""Build a (workload, template, config) into a runnable kernel on the host CPU.

``build`` lowers and JIT-compiles; ``Artifact.prepare`` packs constant weights (outside any
timing) and allocates the output and workspace once; ``PreparedKernel.run`` executes one call.
ctypes releases the GIL for the call, and the kernel's own threads come from libgomp.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping

import numpy as np

from schedule_templates.codegen.llvm_ir import generate_llvm_ir
from schedule_templates.codegen.llvm_jit import CompiledKernel
from schedule_templates.errors import InvalidConfigError
from schedule_templates.ir.nodes import Buffer, Kernel
from schedule_templates.space import Config
from schedule_templates.templates.base import Template, target_kind
from schedule_templates.workloads import Workload

_ALIGN = 64


def aligned_empty(n: int, zero: bool = False) -> np.ndarray:
    """A 1-D float32 array of ``n`` elements starting on a 64-byte boundary."""
    raw = (np.zeros if zero else np.empty)(n + _ALIGN // 4, dtype=np.float32)
    shift = (-raw.ctypes.data % _ALIGN) // 4
    return raw[shift : shift + n]


class PreparedKernel:
    """A kernel bound to its buffers: ``run()`` executes it once."""

    def __init__(self, compiled: CompiledKernel, kernel: Kernel, args: list[np.ndarray],
                 output: np.ndarray, threads: int) -> None:
        self._compiled = compiled
        self._args = args  # keeps the memory alive while pointers to it exist
        self._pointers = [ctypes.c_void_p(a.ctypes.data) for a in args]
        self._threads = ctypes.c_int64(threads)
        self.kernel = kernel
        self.output = output

    def run(self) -> None:
        self._compiled.function(*self._pointers, self._threads)

    def close(self) -> None:
        self._args = []
        self._pointers = []


class Artifact:
    """A compiled candidate, reusable across input sets."""

    def __init__(self, workload: Workload, template: Template, config: Config, kernel: Kernel,
                 compiled: CompiledKernel, threads: int) -> None:
        self.workload = workload
        self.template = template
        self.config = config
        self.kernel = kernel
        self.compiled = compiled
        self.threads = threads

    @property
    def compile_time_s(self) -> float:
        return self.compiled.compile_time_s

    def prepare(self, inputs: Mapping[str, np.ndarray]) -> PreparedKernel:
        packed = self.template.pack(self.workload, self.config, inputs)
        args = [self._bind(buf, packed) for buf in self.kernel.params[:-1]]
        out_buf = self.kernel.output
        out_flat = aligned_empty(out_buf.size + out_buf.slack)
        args.append(out_flat)
        args += [aligned_empty(b.size + b.slack, zero=True) for b in self.kernel.workspace]
        output = out_flat[: out_buf.size].reshape(self.workload.output_shape())
        return PreparedKernel(self.compiled, self.kernel, args, output, self.threads)

    @staticmethod
    def _bind(buf: Buffer, packed: Mapping[str, np.ndarray]) -> np.ndarray:
        try:
            array = packed[buf.name]
        except KeyError:
            raise InvalidConfigError(f"no data for kernel argument {buf.name}") from None
        if array.size != buf.size:
            raise InvalidConfigError(
                f"argument {buf.name} has {array.size} elements, kernel expects {buf.size}"
            )
        flat = aligned_empty(buf.size + buf.slack, zero=buf.slack > 0)
        flat[: buf.size] = np.ascontiguousarray(array, dtype=np.float32).reshape(-1)
        return flat

    def close(self) -> None:
        self.compiled.close()


def lower(workload: Workload, template: Template, config: Config) -> Kernel:
    template.check(workload, config)
    return template.lower(workload, config)


def build(workload: Workload, template: Template, config: Config, target: str = "llvm",
          threads: int = 1) -> Artifact:
    """Lower and compile; InvalidConfigError for a config the template refuses, CodegenError
    when code generation or LLVM fails."""
    if target_kind(target) != "llvm" or template.target_kind != "llvm":
        raise InvalidConfigError(f"runtime.build compiles for the host CPU, not {target!r}")
    kernel = lower(workload, template, config)
    module = generate_llvm_ir(kernel)
    nargs = len(kernel.params) + len(kernel.workspace)
    compiled = CompiledKernel(module, kernel.name, nargs)
    return Artifact(workload, template, config, kernel, compiled, max(1, threads))
