"""The CUDA C generator on hand-built loop nests: launch shape, placement rules, vector
accesses, literals, the printer, and the serial host form run through the LLVM generator."""

import ctypes

import numpy as np
import pytest

from schedule_templates.codegen.cuda_c import generate_cuda
from schedule_templates.codegen.cuda_index import divisible
from schedule_templates.codegen.llvm_ir import generate_llvm_ir
from schedule_templates.codegen.llvm_jit import CompiledKernel
from schedule_templates.errors import CodegenError
from schedule_templates.ir.gpu import launch_dims, serialize_for_host
from schedule_templates.ir.nodes import (
    Allocate,
    Barrier,
    Buffer,
    Const,
    IfThen,
    Kernel,
    LoopKind,
    Scope,
    Select,
    Var,
    binop,
    fmax,
    loop,
    store,
)
from schedule_templates.ir.printer import format_kernel
from schedule_templates.ir.warp import WarpMma

F0 = Const(0.0, "float32")


def reverse_kernel(n_blocks: int = 3, threads: int = 8) -> Kernel:
    """Each block reverses its slice through shared memory: wrong without the barrier's
    phase split, and wrong if the private accumulator were shared between threads."""
    src = Buffer("src", (n_blocks * threads,))
    dst = Buffer("dst", (n_blocks * threads,))
    tile = Buffer("tile", (threads,), Scope.SHARED)
    acc = Buffer("acc", (1,), Scope.LOCAL)
    b, b_loop = loop("b", n_blocks, LoopKind.BLOCK_X)
    t1, t1_loop = loop("t", threads, LoopKind.THREAD_X)
    t2, t2_loop = loop("t", threads, LoopKind.THREAD_X)
    t3, t3_loop = loop("t", threads, LoopKind.THREAD_X)
    body = b_loop(Allocate(tile, (Allocate(acc, (
        t1_loop(store(tile[t1], src[b * threads + t1]), store(acc[0], src[b * threads + t1])),
        Barrier(),
        t2_loop(store(acc[0], tile[threads - 1 - t2] * 10.0 + acc[0])),
        Barrier(),
        t3_loop(store(dst[b * threads + t3], acc[0])),
    )),)))
    return Kernel("reverse", (src, dst), (), (body,))


def run_on_host(kernel: Kernel, arrays: list[np.ndarray]) -> None:
    compiled = CompiledKernel(generate_llvm_ir(kernel), kernel.name, len(arrays))
    try:
        compiled.function(*[ctypes.c_void_p(a.ctypes.data) for a in arrays], 1)
    finally:
        compiled.close()


def test_launch_shape_and_source_shape():
    cuda = generate_cuda(reverse_kernel())
    assert (cuda.grid, cuda.block, cuda.shared_bytes) == ((3, 1, 1), (8, 1, 1), 32)
    assert cuda.params == ("src", "dst")
    src = cuda.source
    assert 'extern "C" __global__ void __launch_bounds__(8)' in src
    assert "reverse(const float* __restrict__ src, float* __restrict__ dst)" in src
    assert src.count("__syncthreads();") == 2
    assert "__shared__ __align__(16) float tile[8];" in src
    assert "float acc[1];" in src
    assert "threadIdx.x" in src and "blockIdx.x" in src


def test_renamed_kernel_and_unused_index():
    n, n_loop = loop("n", 4, LoopKind.THREAD_X)
    out = Buffer("out", (1,))
    kernel = Kernel("k", (out,), (), (n_loop(IfThen(binop("==", n, 0), (store(out[0], 1.0),))),))
    cuda = generate_cuda(kernel, name="renamed-1")
    assert cuda.name == "renamed_1" and "renamed_1(" in cuda.source
    assert "1.0f" in cuda.source


def test_serial_host_form_matches_block_semantics():
    kernel = reverse_kernel()
    src = np.arange(24, dtype=np.float32)
    dst = np.zeros(24, dtype=np.float32)
    run_on_host(serialize_for_host(kernel), [src, dst])
    expected = src.reshape(3, 8)[:, ::-1] * 10 + src.reshape(3, 8)
    np.testing.assert_array_equal(dst, expected.reshape(-1))


def test_private_buffers_get_a_thread_index():
    host = serialize_for_host(reverse_kernel())
    text = format_kernel(host)
    assert "acc: float32[1, 1, 8, 1] local" in text
    assert "barrier" not in text
    assert "barrier" in format_kernel(reverse_kernel())


@pytest.mark.parametrize("bad", ["barrier_in_thread", "block_in_thread", "nested_kind"])
def test_placement_rules(bad):
    out = Buffer("out", (4,))
    t, t_loop = loop("t", 4, LoopKind.THREAD_X)
    if bad == "barrier_in_thread":
        body = t_loop(Barrier(), store(out[t], 0.0))
    elif bad == "block_in_thread":
        _b, b_loop = loop("b", 2, LoopKind.BLOCK_X)
        body = t_loop(b_loop(store(out[t], 0.0)))
    else:
        _t2, t2_loop = loop("u", 2, LoopKind.THREAD_X)
        body = t_loop(t2_loop(store(out[t], 0.0)))
    kernel = Kernel("bad", (out,), (), (body,))
    with pytest.raises(CodegenError):
        generate_cuda(kernel)
    with pytest.raises(CodegenError):
        serialize_for_host(kernel)


def test_private_buffer_outside_threads_is_refused():
    out = Buffer("out", (4,))
    acc = Buffer("acc", (1,), Scope.LOCAL)
    t, t_loop = loop("t", 4, LoopKind.THREAD_X)
    kernel = Kernel("bad", (out,), (), (Allocate(acc, (store(acc[0], 1.0),
                                                        t_loop(store(out[t], acc[0])))),))
    with pytest.raises(CodegenError, match="outside thread loops"):
        serialize_for_host(kernel)


def test_shorter_thread_loop_is_guarded():
    out = Buffer("out", (8,))
    t1, l1 = loop("t", 8, LoopKind.THREAD_X)
    t2, l2 = loop("t", 5, LoopKind.THREAD_X)
    kernel = Kernel("guard", (out,), (), (l1(store(out[t1], 0.0)), Barrier(),
                                         l2(store(out[t2], 1.0))))
    assert launch_dims(kernel).block == (8, 1, 1)
    assert "if (t < 5) {" in generate_cuda(kernel).source


def vector_copy(n: int, offset: int, lanes: int, src_scope: Scope = Scope.GLOBAL) -> str:
    src = Buffer("src", (n + 8,))
    dst = Buffer("dst", (n,))
    t, t_loop = loop("t", n // lanes, LoopKind.THREAD_X)
    v, v_loop = loop("v", lanes, LoopKind.VECTORIZE)
    kernel = Kernel("vec", (src, dst), (), (t_loop(v_loop(
        store(dst[t * lanes + v], src[t * lanes + v + offset] * 2.0))),))
    return generate_cuda(kernel).source


def test_aligned_vector_loads_and_stores():
    src = vector_copy(64, 0, 4)
    assert "const float4 v0 = *reinterpret_cast<const float4*>(&src[t * 4]);" in src
    assert "*reinterpret_cast<float4*>(&dst[t * 4]) = make_float4(v0.x * 2.0f" in src
    assert "float2" in vector_copy(64, 2, 2)


def test_misaligned_vectors_fall_back_to_lanes():
    src = vector_copy(64, 1, 4)  # the loads start one element off: only the store is a float4
    assert "const float4" not in src and "src[t * 4 + 4]" in src
    assert "make_float4" in src


def test_divisibility_analysis():
    x, y = Var("x"), Var("y")
    assert divisible(x * 8 + 4, 4) and divisible(binop("min", x * 4, 12) * 3, 4)
    assert not divisible(x * 2 + 4, 4) and not divisible(x // 4 * 2, 4)
    assert divisible((y % 3) * 16 + x * 4, 4)


def test_select_max_min_and_literals():
    a = Buffer("a", (4,))
    out = Buffer("out", (4,))
    t, t_loop = loop("t", 4, LoopKind.THREAD_X)
    value = Select(binop("and", t >= 1, t < 3), fmax(a[binop("max", t - 1, 0)], 0.5), F0)
    value = binop("min", value, Const(float("inf"), "float32"))
    kernel = Kernel("sel", (a, out), (), (t_loop(store(out[t], value)),))
    src = generate_cuda(kernel).source
    assert "(t >= 1 && t < 3 ? fmaxf(a[max(t - 1, 0)], 0.5f) : 0.0f)" in src
    assert "__int_as_float(0x7f800000)" in src


def test_precedence_keeps_brackets():
    a = Buffer("a", (64,))
    out = Buffer("out", (8,))
    t, t_loop = loop("t", 8, LoopKind.THREAD_X)
    kernel = Kernel("prec", (a, out), (), (t_loop(
        store(out[t], a[(t + 1) * 4 - (t - 2)] + a[t * 7 // (t % 3 + 1)])),))
    src = generate_cuda(kernel).source
    assert "a[(t + 1) * 4 - t + 2]" in src  # sums are flattened, constants gathered
    assert "a[t * 7 / (t % 3 + 1)]" in src


def test_hand_built_kernels_compile(nvcc_compile):
    kernels = [reverse_kernel(), reverse_kernel(2, 64)]
    sources = [(f"k{i}", generate_cuda(k, name=f"k{i}").source) for i, k in enumerate(kernels)]
    sources.append(("vec", vector_copy(64, 0, 4)))
    nvcc_compile(sources)


def mma_kernel(k_words: int = 16) -> Kernel:
    """One warp multiplies a 16 x (4*k_words) u8 tile by a (4*k_words) x 8 s8 tile on the
    tensor cores: both tiles staged in shared memory, each lane stores its 4 accumulators."""
    a = Buffer("a", (16, k_words), dtype="int32")
    b = Buffer("b", (8, k_words), dtype="int32")
    out = Buffer("out", (16, 8), dtype="int32")
    a_sh = Buffer("a_sh", (16, k_words), Scope.SHARED, "int32")
    b_sh = Buffer("b_sh", (8, k_words), Scope.SHARED, "int32")
    acc = Buffer("acc", (4,), Scope.LOCAL, "int32")

    def lanes(body):
        lane, lane_loop = loop("lane", 32, LoopKind.THREAD_X)
        return lane_loop(*body(lane))

    def copy(lane):
        w, w_loop = loop("w", k_words, LoopKind.SERIAL)
        return [IfThen(lane < 16, (w_loop(store(a_sh[lane, w], a[lane, w])),)),
                IfThen(lane < 8, (w_loop(store(b_sh[lane, w], b[lane, w])),))]

    def compute(lane):
        i, i_loop = loop("i", 4, LoopKind.UNROLL)
        steps = [WarpMma(acc[0], a_sh[0, 8 * s], b_sh[0, 8 * s], lane)
                 for s in range(k_words // 8)]
        group, pair = lane // 4, lane % 4
        return [i_loop(store(acc[i], Const(0, "int32"))), *steps,
                i_loop(store(out[group + (i // 2) * 8, pair * 2 + i % 2], acc[i]))]

    body = Allocate(a_sh, (Allocate(b_sh, (Allocate(acc, (
        lanes(copy), Barrier(), lanes(compute))),)),))
    return Kernel("mma", (a, b, out), (), (body,))


def test_warp_mma_emits_the_instruction_and_expands_on_the_host(nvcc_compile):
    kernel = mma_kernel()
    source = generate_cuda(kernel).source
    assert source.count("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32") == 2
    assert "tuner_dp4a_us" not in source
    nvcc_compile([("mma", source)])
    assert "mma" in format_kernel(kernel)  # the printer shows the expansion
    # the host form: every lane's share, in dp4a over the shared tiles, equals the product
    host = serialize_for_host(kernel)
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (16, 64), dtype=np.uint8)
    b = rng.integers(-128, 128, (8, 64), dtype=np.int8)
    out = np.zeros((16, 8), np.int32)
    compiled = CompiledKernel(generate_llvm_ir(host), host.name, 3)
    try:
        args = [np.ascontiguousarray(a).view(np.int32), np.ascontiguousarray(b).view(np.int32),
                out]
        compiled.function(*[ctypes.c_void_p(x.ctypes.data) for x in args], 1)
    finally:
        compiled.close()
    np.testing.assert_array_equal(out, a.astype(np.int64) @ b.astype(np.int64).T)


def test_mutators_keep_warp_mma_and_functors_see_its_expansion():
    from schedule_templates.ir.analysis import stored_buffers
    from schedule_templates.ir.visitor import StmtMutator

    kernel = mma_kernel(8)
    assert StmtMutator().visit_body(kernel.body) is kernel.body  # nothing to change
    # the accumulators the instruction writes count as stored (from its expansion)
    assert {b.name for b in stored_buffers(kernel.body)} >= {"acc", "out"}
