"""Build a (workload, template, config) into a runnable kernel on the host CPU.

``build`` lowers and JIT-compiles; ``Artifact.prepare`` packs constant weights (outside any
timing) and allocates the output and workspace once; ``PreparedKernel.run`` executes one call.
ctypes releases the GIL for the call, and the kernel's own threads come from libgomp.
Buffers hold their kernel element type (int8 kernels take bytes, bfloat16 is numpy uint16 bits);
a kernel whose intrinsics need CPU features the host lacks is refused before LLVM sees it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping

import numpy as np
from llvmlite import ir

from schedule_templates.codegen.llvm_ir import LLVMGenerator
from schedule_templates.codegen.llvm_jit import CompiledKernel, host_features
from schedule_templates.errors import InvalidConfigError, UnsupportedHostError
from schedule_templates.ir.nodes import Buffer, Kernel
from schedule_templates.space import Config
from schedule_templates.target import Target
from schedule_templates.templates.base import Template
from schedule_templates.workloads import Workload

_ALIGN = 64
#: numpy type of each IR element type (bfloat16 travels as its raw 16 bits)
NUMPY_DTYPES: dict[str, type[np.generic]] = {
    "float32": np.float32, "int32": np.int32, "int8": np.int8, "uint8": np.uint8,
    "bfloat16": np.uint16,
}


def aligned_empty(n: int, zero: bool = False, dtype: type[np.generic] = np.float32
                  ) -> np.ndarray:
    """A 1-D array of ``n`` elements starting on a 64-byte boundary."""
    size = np.dtype(dtype).itemsize
    raw = (np.zeros if zero else np.empty)(n + _ALIGN // size, dtype=dtype)
    shift = (-raw.ctypes.data % _ALIGN) // size
    return raw[shift : shift + n]


def buffer_array(buf: Buffer, zero: bool = False) -> np.ndarray:
    """Aligned memory for a kernel buffer, slack included, of its element type."""
    return aligned_empty(buf.size + buf.slack, zero, NUMPY_DTYPES[buf.dtype])


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
        out_flat = buffer_array(out_buf)
        args.append(out_flat)
        args += [buffer_array(b, zero=True) for b in self.kernel.workspace]
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
        flat = buffer_array(buf, zero=buf.slack > 0)
        want = NUMPY_DTYPES[buf.dtype]
        if buf.dtype != "float32" and array.dtype != want:
            # low-precision data is never converted silently: a template's pack must hand
            # over the exact bits (a float array here would be truncated to garbage)
            raise InvalidConfigError(
                f"argument {buf.name} is {array.dtype}, the kernel reads {np.dtype(want)}"
            )
        flat[: buf.size] = np.ascontiguousarray(array, dtype=want).reshape(-1)
        return flat

    def close(self) -> None:
        self.compiled.close()


def lower(workload: Workload, template: Template, config: Config) -> Kernel:
    template.check(workload, config)
    return template.lower(workload, config)


def host_module(kernel: Kernel) -> ir.Module:
    """The kernel's LLVM module, refused with UnsupportedHostError when its intrinsics need CPU
    features this host lacks (LLVM's instruction selection would abort the process)."""
    generator = LLVMGenerator(kernel)
    module = generator.generate()
    have = {f[1:] for f in host_features().split(",") if f.startswith("+")}
    missing = sorted(generator.required_features - have)
    if missing:
        raise UnsupportedHostError(
            f"kernel {kernel.name} needs CPU features this host lacks: {', '.join(missing)}"
        )
    return module


def build(workload: Workload, template: Template, config: Config, target: str = "llvm",
          threads: int = 1) -> Artifact:
    """Lower and compile; InvalidConfigError for a config the template refuses, CodegenError
    when code generation or LLVM fails (UnsupportedHostError, a kind of it, when the kernel
    needs CPU features this host lacks)."""
    if Target.parse(target).kind != "llvm" or template.target_kind != "llvm":
        raise InvalidConfigError(f"runtime.build compiles for the host CPU, not {target!r}")
    kernel = lower(workload, template, config)
    module = host_module(kernel)
    nargs = len(kernel.params) + len(kernel.workspace)
    compiled = CompiledKernel(module, kernel.name, nargs)
    return Artifact(workload, template, config, kernel, compiled, max(1, threads))
