"""JIT compilation of generated LLVM IR for the host CPU, and object-code emission.

The target machine uses the host's CPU name and full feature set (AVX-512 on Zen 4/5 and recent
Intel), with LLVM's 256-bit preference switched off so explicit 512-bit vectors stay in zmm
registers. Each compiled kernel owns its execution engine; ``close`` frees the machine code, so
thousands of candidates can be compiled in one process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import time

import llvmlite.binding as llvm
from llvmlite import ir

from schedule_templates.errors import CodegenError

logger = logging.getLogger(__name__)


@functools.cache
def _initialize() -> bool:
    """Initialise LLVM once per process; returns whether libgomp (thread pool) is available."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()
    path = ctypes.util.find_library("gomp")
    if path is None:
        logger.warning("libgomp not found: parallel loops will run on one thread")
        return False
    try:
        llvm.load_library_permanently(path)
    except RuntimeError as e:
        logger.warning("could not load %s (%s): parallel loops will run on one thread", path, e)
        return False
    return True


def host_features() -> str:
    _initialize()
    features = llvm.get_host_cpu_features().flatten()
    if "+sse4a" in features:
        # AMD's SSE4a: LLVM lowers small byte shuffles (the two overlapping loads of a short
        # strided vector) to ``insertq``, which held 70% of the samples of a stride-2 phase
        # stage on Zen 3 (1.86 ms, 0.16 without it); nothing we generate needs it
        features = features.replace("+sse4a", "-sse4a")
    return features + ",-prefer-256-bit" if "+avx512f" in features else features


def host_target_machine() -> llvm.TargetMachine:
    """A fresh target machine: an MCJIT engine takes ownership of (and frees) the one it gets."""
    _initialize()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=host_features(), opt=3, jit=True
    )


def host_vector_lanes() -> int:
    """fp32 lanes of the widest vector register on this CPU (16 with AVX-512)."""
    features = host_features()
    if "+avx512f" in features:
        return 16
    if "+avx" in features:
        return 8
    return 4


def optimize(module_ir: str, tm: llvm.TargetMachine) -> llvm.ModuleRef:
    try:
        mod = llvm.parse_assembly(module_ir)
        mod.verify()
    except RuntimeError as e:
        raise CodegenError(f"generated LLVM IR is invalid: {e}") from e
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pb = llvm.create_pass_builder(tm, pto)
    try:
        pb.getModulePassManager().run(mod, pb)
    finally:
        pb.close()
        pto.close()
    return mod


class CompiledKernel:
    """A JIT-compiled kernel: ``kernel(*pointers, nthreads)``."""

    def __init__(self, module: ir.Module, name: str, nargs: int) -> None:
        start = time.perf_counter()
        tm = host_target_machine()
        self._module = optimize(str(module), tm)
        self._engine = llvm.create_mcjit_compiler(self._module, tm)
        self._engine.finalize_object()
        self._bind(name, nargs)
        self.compile_time_s = time.perf_counter() - start

    @classmethod
    def from_object(cls, code: bytes, name: str, nargs: int) -> CompiledKernel:
        """Load object code from ``jit_object`` (a compile cache hit: no optimisation and no
        code generation, only relocation; a few milliseconds)."""
        start = time.perf_counter()
        kernel = cls.__new__(cls)
        tm = host_target_machine()
        kernel._module = llvm.parse_assembly("")
        kernel._module.triple = tm.triple
        kernel._engine = llvm.create_mcjit_compiler(kernel._module, tm)
        try:
            kernel._engine.add_object_file(llvm.ObjectFileRef.from_data(code))
            kernel._engine.finalize_object()
        except RuntimeError as e:
            kernel.close()
            raise CodegenError(f"object code for {name} does not load: {e}") from e
        kernel._bind(name, nargs)
        kernel.compile_time_s = time.perf_counter() - start
        return kernel

    def _bind(self, name: str, nargs: int) -> None:
        assert self._engine is not None
        address = self._engine.get_function_address(name)
        if not address:
            raise CodegenError(f"symbol {name} missing after compilation")
        proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nargs), ctypes.c_int64)
        self.function = proto(address)

    def assembly(self) -> str:
        return str(host_target_machine().emit_assembly(self._module))

    def close(self) -> None:
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.close()  # also frees the module it owns
            self._engine = None

    def __del__(self) -> None:
        self.close()


def jit_object(module: ir.Module) -> bytes:
    """Optimised object code for this host's JIT target machine, for
    ``CompiledKernel.from_object`` in this or another process on the same CPU (a compile cache
    keyed by the host's CPU name and features keeps it from crossing machines)."""
    tm = host_target_machine()
    return bytes(tm.emit_object(optimize(str(module), tm)))


def emit_object(module: ir.Module) -> bytes:
    """Position-independent object code for a shared library (the deployable kernel library)."""
    _initialize()
    target = llvm.Target.from_default_triple()
    tm = target.create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=host_features(), opt=3, reloc="pic",
        codemodel="default",
    )
    return bytes(tm.emit_object(optimize(str(module), tm)))
