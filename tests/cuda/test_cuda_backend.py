"""The cuda worker backend's glue, on a mocked pycuda whose "GPU" runs the very kernel IR
serially on the host (LLVM); and the same checks on a real GPU when one is present."""

import ctypes
import itertools
import sys
import types

import numpy as np
import pytest

from schedule_templates.codegen.llvm_ir import generate_llvm_ir
from schedule_templates.codegen.llvm_jit import CompiledKernel
from schedule_templates.ir.gpu import serialize_for_host
from schedule_templates.protocol import Candidate, ClaimItem, Target
from schedule_templates.records import ErrorKind, MeasureOptions
from schedule_templates.templates.base import get_template
from schedule_templates.workloads import parse_workload
from workers.backends import BackendSpec, accelerator_facts, backend_names, create_backend
from workers.errors import BackendError
from workers.measure.runner import measure_task

KEY = "dense:M=24,N=20,K=12"
TARGET = "cuda -arch=sm_90"
LAUNCH_S = 0.0005  # what one launch takes on the fake GPU's event clock


class FakeGpu:
    """Device memory as numpy arrays behind integer handles, and a kernel executor."""

    def __init__(self) -> None:
        self.memory: dict[int, np.ndarray] = {}
        self.handles = itertools.count(0x1000, 0x100)
        self.launches = 0
        self.executor = None  # (cuda kernel name, arrays) -> None
        self.sources: list[str] = []
        self.compile_error: str | None = None
        self.attributes = {"MAX_THREADS_PER_BLOCK": 1024, "MAX_SHARED_MEMORY_PER_BLOCK": 49152,
                           "MAX_REGISTERS_PER_BLOCK": 65536, "WARP_SIZE": 32,
                           "MULTIPROCESSOR_COUNT": 132, "L2_CACHE_SIZE": 50 << 20,
                           "CLOCK_RATE": 1980000}
        self.contexts: list[str] = []
        self.sticky_error: str | None = None

    def module(self) -> types.ModuleType:
        gpu = self
        drv = types.ModuleType("pycuda.driver")

        class Allocation:
            def __init__(self, array: np.ndarray) -> None:
                self.handle = next(gpu.handles)
                gpu.memory[self.handle] = array

            def __int__(self) -> int:
                return self.handle

            def free(self) -> None:
                del gpu.memory[self.handle]

        class Context:
            def pop(self) -> None:
                gpu.contexts.append("pop")

            def detach(self) -> None:
                gpu.contexts.append("detach")

            @staticmethod
            def synchronize() -> None:
                if gpu.sticky_error:
                    raise RuntimeError(gpu.sticky_error)

        class Device:
            def __init__(self, ordinal: int) -> None:
                self.ordinal = ordinal

            def compute_capability(self) -> tuple[int, int]:
                return (9, 0)

            def name(self) -> str:
                return "Fake H100"

            def total_memory(self) -> int:
                return 80 << 30

            def get_attribute(self, attribute: str) -> int:
                return gpu.attributes[attribute]

            def make_context(self) -> Context:
                gpu.contexts.append("make")
                return Context()

        class Event:
            def record(self) -> None:
                self.at = gpu.launches

            def synchronize(self) -> None:
                pass

            def time_since(self, start: "Event") -> float:
                return (self.at - start.at) * LAUNCH_S * 1000.0

        drv.init = lambda: None
        drv.Device = Device
        drv.Context = Context
        drv.Event = Event
        drv.device_attribute = types.SimpleNamespace(**{k: k for k in gpu.attributes})
        # device memory keeps the bytes it was given (pycuda copies an array as it is)
        drv.to_device = lambda array: Allocation(np.array(array))
        drv.mem_alloc = lambda nbytes: Allocation(np.empty(nbytes, dtype=np.uint8))
        drv.memset_d8 = lambda alloc, value, count: gpu.memory[int(alloc)][:count].fill(value)
        drv.memcpy_dtoh = lambda host, alloc: np.copyto(
            host, gpu.memory[int(alloc)].view(host.dtype)[: host.size])

        compiler = types.ModuleType("pycuda.compiler")

        class CompileError(Exception):
            pass

        class Function:
            def __init__(self, name: str) -> None:
                self.name = name

            def prepare(self, signature: str) -> None:
                self.signature = signature

            def prepared_call(self, grid, block, *handles) -> None:
                assert len(handles) == len(self.signature)
                gpu.launches += 1
                gpu.executor(self.name, [gpu.memory[h] for h in handles])

        class SourceModule:
            def __init__(self, source, arch, no_extern_c, options) -> None:
                assert no_extern_c and arch == "sm_90"
                if gpu.compile_error:
                    raise CompileError(gpu.compile_error)
                gpu.sources.append(source)

            def get_function(self, name: str) -> Function:
                assert f"{name}(" in gpu.sources[-1]
                return Function(name)

        compiler.SourceModule = SourceModule
        drv.CompileError = CompileError  # where pycuda defines it (not in pycuda.compiler)
        package = types.ModuleType("pycuda")
        package.driver, package.compiler = drv, compiler
        return package


def host_executor(task: ClaimItem):
    """Run the task's kernel IR serially on the host, on the fake device's arrays."""
    workload = parse_workload(task.candidate.workload)
    template = get_template(workload.op, str(task.target))
    config = template.space(workload).from_json(task.candidate.config)
    kernel = serialize_for_host(template.lower(workload, config))
    compiled = CompiledKernel(generate_llvm_ir(kernel), kernel.name, len(kernel.params))

    def run(_name: str, arrays: list[np.ndarray]) -> None:
        compiled.function(*[ctypes.c_void_p(a.ctypes.data) for a in arrays], 1)

    return run


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> FakeGpu:
    fake = FakeGpu()
    package = fake.module()
    monkeypatch.setitem(sys.modules, "pycuda", package)
    monkeypatch.setitem(sys.modules, "pycuda.driver", package.driver)
    monkeypatch.setitem(sys.modules, "pycuda.compiler", package.compiler)
    return fake


def make_task(config_index: int | None = None, target: str = TARGET, key: str = KEY
              ) -> ClaimItem:
    workload = parse_workload(key)
    template = get_template(workload.op, target)
    index = template.default_config(workload).index if config_index is None else config_index
    return ClaimItem(1, Candidate(template.name, key, {"index": index}), Target.parse(target),
                     MeasureOptions(number=1, repeat=3, min_repeat_ms=2.0))


def test_registered_and_lazy():
    assert "cuda" in backend_names()


def test_missing_pycuda_is_a_clear_error(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    with pytest.raises(BackendError, match="pycuda"):
        create_backend(BackendSpec("cuda"))
    assert accelerator_facts("cuda") == {}
    assert accelerator_facts("llvm") == {}


def test_measures_verifies_and_times_with_events(gpu: FakeGpu):
    task = make_task()
    gpu.executor = host_executor(task)
    backend = create_backend(BackendSpec("cuda"))
    try:
        result = measure_task(backend, task)
    finally:
        backend.close()
    assert result.ok, result.error_message
    assert len(result.costs) == 3
    assert all(c == pytest.approx(LAUNCH_S) for c in result.costs)
    assert gpu.launches >= 5  # verify, warm-up, and number grown until 2 ms per sample
    assert 'extern "C" __global__' in gpu.sources[0]
    assert gpu.memory == {}  # every device buffer freed
    assert gpu.contexts == ["make", "pop", "detach"]


@pytest.mark.parametrize("key", ["conv2d:N=1,C=3,H=8,W=8,K=8,R=3,S=3,pad=1",
                                 "depthwise_conv2d:N=1,C=4,H=9,W=9,R=3,S=3,stride=2,pad=1",
                                 "group_conv2d:N=1,C=8,H=7,W=9,K=12,R=3,S=3,stride=2,pad=1,"
                                 "groups=4,epilogue=scale+bias+residual+relu",
                                 "dense_int8:M=7,N=33,K=13,bias=s32,add=u8",
                                 "dense_int8:M=9,N=16,K=24,out=f32",
                                 "conv2d_int8:N=1,C=8,H=8,W=6,K=12,R=3,S=2,stride=2x1,"
                                 "pad=0x1x1x0,groups=4,out=s8"])
def test_other_templates_through_the_backend(gpu: FakeGpu, key: str):
    task = make_task(key=key)
    gpu.executor = host_executor(task)
    backend = create_backend(BackendSpec("cuda"))
    try:
        assert measure_task(backend, task).ok
    finally:
        backend.close()


def test_wrong_answer_is_caught(gpu: FakeGpu):
    gpu.executor = lambda _name, arrays: arrays[-1].fill(1.0)
    backend = create_backend(BackendSpec("cuda"))
    try:
        result = measure_task(backend, make_task())
    finally:
        backend.close()
    assert result.error is ErrorKind.WRONG_ANSWER


def test_nvcc_failure_is_a_device_compile_error(gpu: FakeGpu):
    gpu.compile_error = "ptxas error: too much shared data"
    backend = create_backend(BackendSpec("cuda"))
    try:
        result = measure_task(backend, make_task())
    finally:
        backend.close()
    assert result.error is ErrorKind.COMPILE_DEVICE
    assert "too much shared data" in result.error_message


def test_other_architecture_and_device_limits_are_refused(gpu: FakeGpu):
    gpu.attributes["MAX_THREADS_PER_BLOCK"] = 64  # the 256-thread default tile cannot run
    backend = create_backend(BackendSpec("cuda"))
    try:
        wrong_arch = measure_task(backend, make_task(target="cuda -arch=sm_80"))
        assert wrong_arch.error is ErrorKind.INSTANTIATION and "sm_80" in wrong_arch.error_message
        workload = parse_workload("dense:M=512,N=512,K=512")
        template = get_template("dense", TARGET)
        big = template.default_config(workload).index  # 256 threads
        over = measure_task(backend, make_task(big, key="dense:M=512,N=512,K=512"))
        assert over.error is ErrorKind.INSTANTIATION and "limits" in over.error_message
    finally:
        backend.close()


def test_registration_reports_the_gpu(gpu: FakeGpu):
    from workers.backends.cuda import gpu_facts, target_for

    facts = accelerator_facts("cuda")["gpu"]
    assert facts["compute_capability"] == "sm_90" and facts["name"] == "Fake H100"
    assert facts["max_shared_memory_per_block"] == 49152
    assert facts["max_registers_per_block"] == 65536 and facts["warp_size"] == 32
    assert str(target_for(gpu_facts())) == "cuda -arch=sm_90"


def _real_gpu() -> str | None:
    """None when a GPU can run the test, else why not (a missing pycuda is not a missing GPU)."""
    try:
        import pycuda.driver as drv
    except ImportError:
        return "pycuda is not installed (pip install '.[cuda]')"
    try:
        drv.init()
        return None if drv.Device.count() else "the CUDA driver sees no device"
    except Exception as e:  # the driver's own error: no driver, no GPU
        return f"no usable CUDA GPU ({type(e).__name__}: {e})"


@pytest.mark.skipif(_real_gpu() is not None, reason=f"real-GPU test: {_real_gpu()}")
@pytest.mark.parametrize("key", [KEY, "conv2d:N=1,C=16,H=14,W=14,K=32,R=3,S=3,pad=1",
                                 "depthwise_conv2d:N=1,C=8,H=14,W=14,R=3,S=3,pad=1",
                                 "group_conv2d:N=1,C=64,H=15,W=15,K=64,R=3,S=3,stride=2,"
                                 "pad=1,groups=8,epilogue=bias+relu",
                                 "batch_matmul:B=2,M=33,N=40,K=17",
                                 "dense_int8:M=33,N=40,K=68,bias=s32",
                                 "dense_int8:M=5,N=20,K=13,out=s8,scale=tensor,add=s8",
                                 "conv2d_int8:N=1,C=16,H=14,W=14,K=32,R=3,S=3,pad=1",
                                 "conv2d_int8:N=2,C=12,H=9,W=9,K=12,R=3,S=3,stride=2,pad=1,"
                                 "groups=3,out=f32"])
def test_real_gpu_matches_numpy(key: str):
    from workers.backends.cuda import gpu_facts, target_for

    target = str(target_for(gpu_facts()))
    backend = create_backend(BackendSpec("cuda"))
    try:
        workload = parse_workload(key)
        space = get_template(workload.op, target).space(workload, backend.facts)
        for index in [None, *space.sample(3, np.random.default_rng(0))]:
            result = measure_task(backend, make_task(index, target=target, key=key))
            assert result.ok, result.error_message
    finally:
        backend.close()


def test_a_sticky_launch_fault_marks_the_backend_unhealthy(gpu: FakeGpu):
    backend = create_backend(BackendSpec("cuda"))
    try:
        assert backend.healthy()
        gpu.sticky_error = "an illegal memory access was encountered"
        assert not backend.healthy()  # the measuring child is then replaced
    finally:
        backend.close()
