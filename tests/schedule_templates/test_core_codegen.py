"""Code generation paths: vector loads by stride, scatter stores, threads, IR printing."""

import ctypes
import os
import resource

import numpy as np
import pytest

from schedule_templates.codegen.llvm_ir import generate_llvm_ir
from schedule_templates.codegen.llvm_jit import CompiledKernel, host_features
from schedule_templates.ir.nodes import (
    Buffer,
    Kernel,
    LoopKind,
    Select,
    binop,
    loop,
    prefetch,
    store,
)
from schedule_templates.ir.printer import format_kernel
from schedule_templates.peak import measure_peak_gflops
from schedule_templates.runtime import aligned_empty, build
from schedule_templates.templates.base import get_template
from schedule_templates.workloads import parse_workload


def run_kernel(kernel, arrays, threads=1):
    compiled = CompiledKernel(generate_llvm_ir(kernel), kernel.name, len(arrays))
    try:
        compiled.function(*[ctypes.c_void_p(a.ctypes.data) for a in arrays], threads)
    finally:
        compiled.close()


@pytest.mark.parametrize("stride, slack", [(1, 0), (2, 1), (3, 2), (2, 0), (3, 0), (4, 0),
                                           (5, 4)])
def test_strided_vector_loads(stride, slack):
    n = 20
    src = Buffer("src", (n * stride,), slack=slack)
    dst = Buffer("dst", (n,))
    v, vec = loop("v", n, LoopKind.VECTORIZE)
    kernel = Kernel("strided", (src, dst), (), (vec(store(dst[v], src[v * stride] * 2.0)),))
    a = aligned_empty(n * stride + slack)
    a[:] = np.arange(a.size, dtype=np.float32)
    out = aligned_empty(n, zero=True)
    run_kernel(kernel, [a, out])
    np.testing.assert_array_equal(out, 2 * a[: n * stride : stride])


@pytest.mark.parametrize("stride", [2, 3, 4])
def test_strided_byte_loads_without_slack(stride):
    """Bytes read ``stride`` apart from a buffer without slack: two overlapping loads of a
    power-of-two width and a shuffle (both halves' lanes checked, 16 per vector and a tail)."""
    n = 37
    src = Buffer("src", ((n - 1) * stride + 1,), dtype="uint8")
    dst = Buffer("dst", (n,), dtype="uint8")
    v, vec = loop("v", n, LoopKind.VECTORIZE)
    kernel = Kernel("strided_bytes", (src, dst), (), (vec(store(dst[v], src[v * stride])),))
    a = np.random.default_rng(stride).integers(0, 256, (n - 1) * stride + 1, dtype=np.uint8)
    out = np.zeros(n, np.uint8)
    ir_text = str(generate_llvm_ir(kernel))
    assert "x i8>" in ir_text and "shufflevector" in ir_text
    run_kernel(kernel, [a, out])
    np.testing.assert_array_equal(out, a[::stride])


def test_scatter_store_broadcast_and_select():
    src = Buffer("src", (8,))
    dst = Buffer("dst", (8, 4))
    i, outer = loop("i", 4)
    v, vec = loop("v", 8, LoopKind.VECTORIZE)
    value = Select(binop("==", i, 2), src[v] * -1.0, src[v] + 1.0)
    kernel = Kernel("scatter", (src, dst), (), (outer(vec(store(dst[v, i], value))),))
    a = np.arange(8, dtype=np.float32)
    out = np.zeros((8, 4), np.float32)
    run_kernel(kernel, [a, out])
    expected = np.stack([a + 1, a + 1, -a, a + 1], axis=1)
    np.testing.assert_array_equal(out, expected)


def test_non_affine_index_falls_back_to_lanes():
    src = Buffer("src", (16,))
    dst = Buffer("dst", (16,))
    v, vec = loop("v", 16, LoopKind.VECTORIZE)
    kernel = Kernel("perm", (src, dst), (), (vec(store(dst[v], src[(v * 7) % 16])),))
    a = np.arange(16, dtype=np.float32)
    out = np.zeros(16, np.float32)
    run_kernel(kernel, [a, out])
    np.testing.assert_array_equal(out, a[(np.arange(16) * 7) % 16])


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_parallel_loop_covers_every_iteration(threads):
    dst = Buffer("dst", (37, 5))
    t, par = loop("t", 37, LoopKind.PARALLEL)
    j, inner = loop("j", 5)
    kernel = Kernel("par", (dst,), (), (par(inner(store(dst[t, j], dst[t, j] + 1.0))),))
    out = np.zeros((37, 5), np.float32)
    run_kernel(kernel, [out], threads)
    np.testing.assert_array_equal(out, 1.0)


def test_generated_code_uses_avx512_fma_when_available():
    if "+avx512f" not in host_features():
        pytest.skip("host has no AVX-512")
    workload = parse_workload("dense:M=64,N=64,K=64")
    template = get_template("dense")
    artifact = build(workload, template, template.default_config(workload))
    try:
        asm = artifact.compiled.assembly()
    finally:
        artifact.close()
    assert "zmm" in asm and "vfmadd" in asm


def test_prefetch_hints_change_nothing_and_may_point_past_the_buffer():
    src, dst = Buffer("src", (8, 16)), Buffer("dst", (8, 16))
    i, rows = loop("i", 8)
    v, vec = loop("v", 16, LoopKind.VECTORIZE)
    # the last rows' hints point past the end of src: a prefetch never faults
    body = rows(prefetch(src[i + 4, 0]), prefetch(src[i + 400, 0], locality=3),
                vec(store(dst[i, v], src[i, v] * 2.0)))
    kernel = Kernel("hinted", (src, dst), (), (body,))
    text = str(generate_llvm_ir(kernel))
    assert text.count("call void @\"llvm.prefetch.p0\"") == 2
    assert "i32 0, i32 3, i32 1" in text  # read, keep in L1, data cache
    assert "prefetch src[i + 4, 0] locality=2" in format_kernel(kernel)
    a = np.arange(128, dtype=np.float32).reshape(8, 16)
    out = np.zeros((8, 16), np.float32)
    run_kernel(kernel, [a, out])
    np.testing.assert_array_equal(out, a * 2)
    with pytest.raises(ValueError, match="locality"):
        prefetch(src[0, 0], locality=4)


@pytest.mark.parametrize("key, config", [
    ("dense:M=128,N=768,K=768,epilogue=bias", {}),
    ("conv2d:N=1,C=64,H=7,W=7,K=64,R=3,S=3,pad=1", {"algorithm": "direct"}),
    ("conv2d:N=1,C=64,H=7,W=7,K=64,R=3,S=3,pad=1", {"algorithm": "direct",
                                                    "reduce_order": "rs_c"}),
    ("conv2d:N=1,C=64,H=14,W=14,K=64,R=3,S=3,pad=1", {"algorithm": "winograd2"}),
    ("conv2d_nchwc:N=1,C=64,H=14,W=14,K=64,R=1,S=1,block=16", {}),
])
def test_weighted_kernels_hint_their_next_weights(key, config):
    workload = parse_workload(key)
    template = get_template(workload.op)
    default = template.default_config(workload)
    chosen = template.space(workload).from_entities(
        {**{name: value for name, _kind, value in default.entities}, **config})
    text = format_kernel(template.lower(workload, chosen))
    assert "prefetch weight_packed[" in text


def test_batch_matmul_hints_nothing():
    # both of its operands are activations, already in cache inside a model
    workload = parse_workload("batch_matmul:B=2,M=16,N=16,K=16")
    template = get_template("batch_matmul")
    assert "prefetch" not in format_kernel(template.lower(workload,
                                                          template.default_config(workload)))


def test_printed_ir_is_readable():
    workload = parse_workload("conv2d:N=1,C=4,H=6,W=6,K=16,R=3,S=3,pad=1")
    template = get_template("conv2d")
    text = format_kernel(template.lower(workload, template.default_config(workload)))
    assert "parallel for" in text and "vectorize for k in 0..16" in text
    assert "data_pad" in text and "alloc acc" in text


def test_peak_loop_reports_a_plausible_number():
    assert 1.0 < measure_peak_gflops(1, repeat=2) < 10_000


@pytest.mark.parametrize("instruction", ["pmaddwd", "pmaddubsw"])
def test_avx2_dot_peak_loop_keeps_the_multiply_in_the_loop(instruction):
    """AVX2's int8 peaks: the product reads the accumulator it adds to, so LLVM cannot hoist it
    out of the loop (it did when both operands were the constant: 1325 GOPS, 13x the FMA
    peak, where the real one is about 1.5x)."""
    import llvmlite.binding as llvm

    from schedule_templates.codegen.llvm_jit import _initialize, optimize
    from schedule_templates.peak import peak_kernel

    kernel = peak_kernel(1, 8, 12, instruction)
    _initialize()
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu="znver3", features="+avx2", opt=3)
    asm = machine.emit_assembly(optimize(str(generate_llvm_ir(kernel)), machine))
    assert asm.count(f"v{instruction}") >= 12 and asm.count("vpaddd") >= 12
    if "+avx2" in host_features().split(","):
        # the best of three each, interleaved: with the other test worker beside it one
        # measurement of the FMA loop read 46 GFLOPS (117 quiet, Zen 4) against pmaddwd's 231;
        # a hoisted product runs 13x the FMA peak, so 8x still tells the two apart
        fma = dot = 0.0
        for _ in range(3):
            fma = max(fma, measure_peak_gflops(1, repeat=2))
            dot = max(dot, measure_peak_gflops(1, repeat=2, instruction=instruction))
        assert 0.5 * fma < dot < 8 * fma


@pytest.mark.parametrize("instruction,feature", [("vpdpbusd", "+avx512vnni"),
                                                 ("dpbf16ps", "+avx512bf16")])
def test_dot_peak_loop_runs_on_its_instruction(instruction, feature):
    """The low-precision peaks are the same loop on the dot-product instruction: compiled for
    a CPU that has it, the hot loop holds one per accumulator and no fp32 FMA; run where this
    host has it."""
    import llvmlite.binding as llvm

    from schedule_templates.codegen.llvm_jit import _initialize, optimize
    from schedule_templates.peak import peak_kernel

    kernel = peak_kernel(1, 16, 28, instruction)
    _initialize()
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu="sapphirerapids", features=f"+avx512f,+avx512bw,{feature}", opt=3)
    asm = machine.emit_assembly(optimize(str(generate_llvm_ir(kernel)), machine))
    mnemonic = "vdpbf16ps" if instruction == "dpbf16ps" else instruction
    assert asm.count(mnemonic) >= 28 and "vfmadd" not in asm
    if feature in host_features().split(","):
        assert 1.0 < measure_peak_gflops(1, repeat=2, instruction=instruction) < 100_000


@pytest.mark.slow
def test_compiling_many_candidates_does_not_grow_memory():
    workload = parse_workload("dense:M=32,N=32,K=32")
    template = get_template("dense")
    space = template.space(workload)
    indices = space.sample(150, np.random.default_rng(0))

    def compile_batch(batch):
        for i in batch:
            build(workload, template, space.get(i)).close()

    compile_batch(indices[:50])  # warm up allocator pools and caches
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    compile_batch(indices[50:])
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    # closed kernels grow RSS about 0.14 MB a compile (allocator), kernels kept alive (engine
    # and module never freed) about 1 MB
    assert grown_mb < 25, f"RSS grew {grown_mb:.0f} MB over 100 compiles (pid {os.getpid()})"


def test_sse4a_is_switched_off_for_amd_hosts(monkeypatch):
    """AMD's SSE4a ``insertq`` was LLVM's lowering of short strided byte loads and made a
    stride-2 int8 phase stage 12x slower on Zen 3: the features we compile for drop it."""
    import llvmlite.binding as llvm

    from schedule_templates.codegen import llvm_jit

    class Features:
        def flatten(self) -> str:
            return "+avx2,+fma,+sse4a,+sse4.2"

    monkeypatch.setattr(llvm, "get_host_cpu_features", lambda: Features())
    features = llvm_jit.host_features().split(",")
    assert "-sse4a" in features and "+sse4a" not in features and "+avx2" in features
