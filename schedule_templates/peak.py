"""A generated FMA loop that measures the machine's fp32 peak with our own code generator.

Each thread keeps as many independent vector accumulators busy with fused multiply-adds as the
host's register file holds beside the operand (``host_registers``: 14 of 16 ymm on AVX2, 28 of 32
zmm on AVX-512), enough to cover the FMA latency on two pipes, so the loop runs at the core's FMA
throughput. More accumulators than registers spill: a fixed 24 on a Zen 3 (AVX2) host measured
33 GFLOPS per core against 104 with 14, while our dense kernel reached 67.

The same loop on a dot-product instruction (``vpdpbusd``, ``dpbf16ps``) gives the peak of the
low-precision kernels, which is not always a multiple of the fp32 one: on an Intel Xeon
(family 6 model 207) ``vdpbf16ps`` on zmm measured 86 GFLOPS per core against 175 for fp32
FMAs (64 flops per instruction against 32, issued a quarter as often), so bf16 there saves
bytes, not arithmetic. Hosts without VNNI run int8 on ``pmaddwd`` (vpmaddwd + vpaddd on ymm,
12 chains): on a Zen 3 it measured 150 GOPS per core against 103 GFLOPS of FMAs, so AVX2's
int8 can at best be 1.45x the fp32 kernel there. Narrow weights (within +-64) run on
``pmaddubsw`` (vpmaddubsw + vpmaddwd by ones + vpaddd, 4 byte products per lane), which the
same loop measures too.
"""

from __future__ import annotations

import time

import numpy as np

from schedule_templates.codegen.llvm_ir import generate_llvm_ir
from schedule_templates.codegen.llvm_jit import CompiledKernel, host_vector_lanes
from schedule_templates.ir.nodes import (
    INTRINSICS,
    Allocate,
    Buffer,
    Expr,
    Intrinsic,
    Kernel,
    LoopKind,
    Scope,
    loop,
    store,
)
from schedule_templates.runtime import aligned_empty
from schedule_templates.templates.choose import host_registers

#: long enough (a few ms per run) that starting the threads is noise, short enough to repeat
ITERATIONS = 1 << 20

#: operations per 32-bit lane of one instruction (a multiply-add counts two): the fp32 FMA and
#: the dot-product intrinsics of the low-precision kernels
OPS_PER_LANE = {"fma": 2, "vpdpbusd": 8, "dpbf16ps": 4, "pmaddwd": 4, "pmaddubsw": 8}
#: the operand's bits: 0.5 in fp32 (a contraction: values stay finite however long the loop
#: runs), bytes of 1 for vpdpbusd (int32 wraps), a pair of bf16 0.5 for dpbf16ps, a pair of
#: 16-bit 1 for pmaddwd (AVX2's int8 path: vpmaddwd then vpaddd), bytes of 1 for pmaddubsw
OPERAND = {"fma": np.float32(0.5).view(np.int32), "vpdpbusd": 0x01010101,
           "dpbf16ps": 0x3F003F00, "pmaddwd": 0x00010001, "pmaddubsw": 0x01010101}
#: the AVX2 instructions: ymm registers (8 lanes), 12 chains (registers left for the operands)
YMM_DOTS = ("pmaddwd", "pmaddubsw")


def peak_kernel(threads: int, lanes: int, accumulators: int, instruction: str = "fma"
                ) -> Kernel:
    """``accumulators`` independent chains of ``instruction`` per thread (see OPS_PER_LANE)."""
    fma = instruction == "fma"
    dtype = "float32" if fma else INTRINSICS[instruction].result
    scale = Buffer("scale", (lanes,), dtype="float32" if fma else "int32")
    out = Buffer("out", (threads, accumulators, lanes), dtype=dtype)
    acc = Buffer("acc", (accumulators, lanes), Scope.LOCAL, dtype=dtype)
    t, par = loop("t", threads, LoopKind.PARALLEL)
    a, unroll = loop("a", accumulators, LoopKind.UNROLL)
    v, vec = loop("v", lanes, LoopKind.VECTORIZE)
    _, steps = loop("i", ITERATIONS)
    # the AVX2 dots add their product to the accumulator outside the instruction: the product
    # reads the accumulator, or LLVM would hoist it out of the loop
    operand = acc[a, v] if instruction in YMM_DOTS else scale[v]
    update: Expr = (acc[a, v] * scale[v] + scale[v] if fma
                    else Intrinsic(instruction, (acc[a, v], operand, scale[v])))
    body = par(Allocate(acc, (
        unroll(vec(store(acc[a, v], out[t, a, v]))),
        steps(unroll(vec(store(acc[a, v], update)))),
        unroll(vec(store(out[t, a, v], acc[a, v]))),
    )))
    return Kernel(f"{instruction}_peak", (scale, out), (), (body,))


def measure_peak_gflops(threads: int = 1, repeat: int = 15, instruction: str = "fma"
                        ) -> float:
    """Best of ``repeat`` runs of the ``instruction`` loop on ``threads`` threads, in GFLOPS
    (GOPS for the integer dot product). The dot-product intrinsics need the host's AVX-512 VNNI
    or BF16 (``ScheduleError`` from the code generator elsewhere).

    Best-of, because a peak is what the core can do: on a busy machine most runs lose a thread
    to another process for part of the time, and a few runs do not."""
    import ctypes

    # AVX2's dots work on ymm registers: 8 lanes, 12 chains (registers for operands)
    lanes = host_vector_lanes() if instruction in ("fma", *YMM_DOTS) else 16
    accumulators = 12 if instruction in YMM_DOTS else host_registers().accumulators
    kernel = peak_kernel(threads, lanes, accumulators, instruction)
    compiled = CompiledKernel(generate_llvm_ir(kernel), kernel.name, 2)
    try:
        scale = aligned_empty(lanes, dtype=np.int32)
        scale[:] = OPERAND[instruction]
        out = aligned_empty(threads * accumulators * lanes, zero=True, dtype=np.int32)
        args = [ctypes.c_void_p(scale.ctypes.data), ctypes.c_void_p(out.ctypes.data)]
        compiled.function(*args, threads)  # warm-up: page faults, thread start
        best = np.inf
        for _ in range(repeat):
            start = time.perf_counter()
            compiled.function(*args, threads)
            best = min(best, time.perf_counter() - start)
        ops = OPS_PER_LANE[instruction] * threads * ITERATIONS * accumulators * lanes
        return float(ops / best / 1e9)
    finally:
        compiled.close()


#: operations of one tile dot product (16 x 16 sums of 64 bytes: 4 u8 x s8 products a word,
#: or 2 bf16 products, each a multiply and an add)
TILE_OPS = {"tdpbusd": 16 * 16 * 16 * 4 * 2, "tdpbf16ps": 16 * 16 * 16 * 2 * 2}
TILE_STEPS = 1 << 16  # steps per run (a few ms)


def tile_peak_kernel(threads: int, dot: str) -> Kernel:
    """2 x 2 tiles of sums per thread over ``TILE_STEPS`` steps that reload the same four
    operand tiles (L1-resident): the block shape and load mix of the AMX kernels."""
    from schedule_templates.ir.amx import TILE_DOTS, TileMatmul
    from schedule_templates.ir.nodes import Var

    a = Buffer("a", (32, 16), dtype="int32")
    b = Buffer("b", (2, 16, 16), dtype="int32")
    out = Buffer("out", (threads, 32, 32), dtype=TILE_DOTS[dot])
    acc = Buffer("acc", (32, 32), Scope.LOCAL, dtype=TILE_DOTS[dot])
    t, par = loop("t", threads, LoopKind.PARALLEL)
    r, rows = loop("r", 32)
    j, vec = loop("j", 32, LoopKind.VECTORIZE)
    product = TileMatmul(dot, acc, Var("k"), TILE_STEPS, a[0, 0], 16, 256, b[0, 0, 0], 16, 256,
                         2, 2)
    body = par(Allocate(acc, (product, rows(vec(store(out[t, r, j], acc[r, j]))))))
    return Kernel(f"{dot}_peak", (a, b, out), (), (body,))


def measure_tile_peak_gops(threads: int = 1, dot: str = "tdpbusd", repeat: int = 7) -> float:
    """Best of ``repeat`` runs of ``tile_peak_kernel``, in GOPS (GFLOPS for bf16); needs a host
    that grants AMX tiles (``x86_amx_gemm.host_amx``)."""
    import ctypes

    kernel = tile_peak_kernel(threads, dot)
    compiled = CompiledKernel(generate_llvm_ir(kernel), kernel.name, 3)
    try:
        a = aligned_empty(32 * 16, zero=True, dtype=np.int32)
        b = aligned_empty(2 * 16 * 16, zero=True, dtype=np.int32)
        out = aligned_empty(threads * 32 * 32, zero=True, dtype=np.int32)
        args = [ctypes.c_void_p(x.ctypes.data) for x in (a, b, out)]
        compiled.function(*args, threads)
        best = np.inf
        for _ in range(repeat):
            start = time.perf_counter()
            compiled.function(*args, threads)
            best = min(best, time.perf_counter() - start)
        return float(4 * TILE_OPS[dot] * TILE_STEPS * threads / best / 1e9)
    finally:
        compiled.close()
