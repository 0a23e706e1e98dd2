"""The CPU backend: lower with the worker's own templates, JIT-compile with llvmlite, time.

Inputs and the numpy reference depend only on the workload, so they are kept for the last
workloads measured: a claimed batch is usually many configs of one task, and a worker fed by a
pipeline sees the tasks of a whole model in turn (ResNet-18 has 12), so the default keeps 16.

In a worker, candidates are built to object code (``compile_cached``): the worker's main
process keeps it in its compile cache, and a config measured again is only loaded (MCJIT
relocates the object; no optimisation, no code generation). Object code is what llvmlite lets
us move between processes safely; a JIT'd engine cannot leave the process that made it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from schedule_templates.errors import InvalidConfigError
from schedule_templates.protocol import ClaimItem
from schedule_templates.workloads import Workload
from workers.backends.base import (
    Backend,
    BoundKernel,
    Decoded,
    OperandCache,
    Operands,
    reduction_length,
    resolve,
)
from workers.compile_cache import CompileKey
from workers.errors import BackendError

logger = logging.getLogger(__name__)


class _LlvmKernel:
    def __init__(self, artifact: Any, prepared: Any, operands: Operands) -> None:
        self._artifact = artifact
        self._prepared = prepared
        self._operands = operands
        self.reduction_length = reduction_length(operands.workload)

    def run(self) -> None:
        self._prepared.run()

    @property
    def output(self) -> np.ndarray:
        return np.asarray(self._prepared.output)

    def expected(self) -> np.ndarray:
        return self._operands.reference()

    def close(self) -> None:
        try:
            self._prepared.close()
        finally:
            self._artifact.close()


class LlvmBackend(Backend):
    name = "llvm"

    def __init__(self, cached_workloads: int = 16) -> None:
        self._operands = OperandCache(cached_workloads)

    def compile(self, task: ClaimItem, resolved: Decoded | None) -> BoundKernel:
        try:
            from schedule_templates.runtime import build
        except ImportError as e:
            raise BackendError(f"the llvm backend needs llvmlite and the runtime: {e}") from e
        if resolved is None:
            resolved = resolve(task)
        artifact = build(resolved.workload, resolved.template, resolved.config,
                         target=str(task.target), threads=task.threads)
        return self._bind(artifact, resolved.workload)

    def _bind(self, artifact: Any, workload: Workload) -> _LlvmKernel:
        try:
            operands = self._operands.get(workload)
            prepared = artifact.prepare(operands.inputs)
        except BaseException:
            artifact.close()
            raise
        return _LlvmKernel(artifact, prepared, operands)

    def compile_cached(self, task: ClaimItem, resolved: Decoded | None, code: bytes | None
                       ) -> tuple[BoundKernel, bytes | None]:
        try:
            from schedule_templates.codegen.llvm_jit import CompiledKernel, jit_object
            from schedule_templates.runtime import Artifact, host_module
        except ImportError as e:
            raise BackendError(f"the llvm backend needs llvmlite and the runtime: {e}") from e
        if resolved is None:
            resolved = resolve(task)
        workload, template, config = resolved.workload, resolved.template, resolved.config
        # checked when decoded; cheap, and the object code names no buffers
        kernel = template.lower(workload, config)
        fresh = None
        if code is None:
            code = fresh = jit_object(host_module(kernel))  # refuses a CPU lacking VNNI etc.
        compiled = CompiledKernel.from_object(code, kernel.name,
                                              len(kernel.params) + len(kernel.workspace))
        artifact = Artifact(workload, template, config, kernel, compiled, max(1, task.threads))
        return self._bind(artifact, workload), fresh

    @classmethod
    def cache_key(cls, task: ClaimItem, options: Mapping[str, Any]) -> CompileKey | None:
        from schedule_templates.templates.base import template_by_name

        candidate = task.candidate
        try:
            template = template_by_name(candidate.template)
        except InvalidConfigError:
            return None  # the measuring child reports it
        if candidate.template_version not in (None, template.version):
            return None
        return CompileKey(template.name, template.version, candidate.workload,
                          CompileKey.canonical_config(dict(candidate.config)), str(task.target),
                          host_cpu_id())

    def measure_peak(self, threads: int) -> float | None:
        from schedule_templates.peak import measure_peak_gflops

        return measure_peak_gflops(threads)


@functools.cache
def host_cpu_id() -> str:
    """The host CPU's name and code-generation features: object code built for one CPU is only
    reused on the same one (part of every compile cache key)."""
    import llvmlite.binding as llvm

    from schedule_templates.codegen.llvm_jit import host_features

    return f"{llvm.get_host_cpu_name()}:{host_features()}"
