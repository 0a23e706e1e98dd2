"""Compile a generated operator for the host CPU and call it on numpy arrays.

Tests check every operator against its ``reference`` through this, and the deploy integration
uses it for its own checks, so it binds arguments exactly as a model library does: inputs in
``input_shapes()`` order as dense copies of each buffer's element type (fp32 but for the
quantized operators) on 64-byte boundaries, then ``out``, then any workspace, then the thread
count.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping

import numpy as np

from schedule_templates.codegen.llvm_ir import generate_llvm_ir
from schedule_templates.codegen.llvm_jit import CompiledKernel
from schedule_templates.errors import CodegenError
from schedule_templates.ir.nodes import Kernel
from schedule_templates.ops.base import GeneratedOp, GeneratedOpError
from schedule_templates.runtime import buffer_array


class CompiledOp:
    """A JIT-compiled generated operator: ``compiled({"x0": a, ...}, threads=2)``."""

    def __init__(self, op: GeneratedOp, kernel: Kernel, llvm_ir: str,
                 compiled: CompiledKernel) -> None:
        self.op = op
        self.kernel = kernel
        self.llvm_ir = llvm_ir  # the unoptimised module, for inspection
        self._compiled = compiled

    @property
    def compile_time_s(self) -> float:
        return self._compiled.compile_time_s

    def __call__(self, inputs: Mapping[str, np.ndarray], threads: int = 1) -> np.ndarray:
        expected = self.op.input_shapes()
        if set(inputs) != set(expected):
            raise GeneratedOpError(f"{self.op.kind}: expected inputs {list(expected)}, "
                                   f"got {sorted(inputs)}")
        args = []
        for (name, shape), buf in zip(expected.items(), self.kernel.params, strict=False):
            array = np.asarray(inputs[name])
            if tuple(array.shape) != tuple(shape):
                raise GeneratedOpError(f"{self.op.kind}: input {name} has shape "
                                       f"{tuple(array.shape)}, expected {tuple(shape)}")
            flat = buffer_array(buf, zero=True)
            flat[: array.size] = np.asarray(array, dtype=flat.dtype).reshape(-1)
            args.append(flat)
        out_shape = self.op.output_shape()
        out = buffer_array(self.kernel.output, zero=True)
        args.append(out)
        args += [buffer_array(b, zero=True) for b in self.kernel.workspace]
        pointers = [ctypes.c_void_p(a.ctypes.data) for a in args]
        self._compiled.function(*pointers, ctypes.c_int64(max(1, threads)))
        return out[: int(np.prod(out_shape, dtype=np.int64))].reshape(out_shape).copy()

    def close(self) -> None:
        self._compiled.close()


def compile_op(op: GeneratedOp) -> CompiledOp:
    """Lower and JIT-compile; CodegenError when code generation or LLVM fails."""
    kernel = op.lower()
    if kernel.output.name != "out":
        raise CodegenError(f"{op.kind}: the output buffer must be named 'out', "
                           f"not {kernel.output.name!r}")
    module = generate_llvm_ir(kernel)
    nargs = len(kernel.params) + len(kernel.workspace)
    return CompiledOp(op, kernel, str(module), CompiledKernel(module, kernel.name, nargs))
