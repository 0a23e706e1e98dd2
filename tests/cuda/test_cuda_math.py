"""Math functions and float division in generated CUDA C: the device library's calls, kept
intact inside the float4 path, and the source compiles with nvcc (skipped without it)."""

import pytest

from schedule_templates.codegen.cuda_c import generate_cuda
from schedule_templates.ir.nodes import MATH_FUNCS, Buffer, Kernel, LoopKind, call, loop, store

_EXPECTED = {"exp": "expf(", "log": "logf(", "sqrt": "sqrtf(", "tanh": "tanhf(",
             "erf": "erff(", "sigmoid": "1.0f / (1.0f + expf(-(", "abs": "fabsf(",
             "floor": "floorf("}


def math_kernel(fn: str, vector: bool) -> Kernel:
    src, dst = Buffer("src", (256,)), Buffer("dst", (256,))
    t, threads = loop("t", 64, LoopKind.THREAD_X)
    v, lanes = loop("v", 4, LoopKind.VECTORIZE if vector else LoopKind.UNROLL)
    x = src[t * 4 + v]
    value = call(fn, x / 3.0) * 2.0 + 1.0 / (x + 4.0)
    return Kernel(f"math_{fn}", (src, dst), (), (threads(lanes(store(dst[t * 4 + v], value))),))


@pytest.mark.parametrize("vector", [False, True])
@pytest.mark.parametrize("fn", MATH_FUNCS)
def test_calls_and_division_are_emitted(fn, vector):
    source = generate_cuda(math_kernel(fn, vector)).source
    assert _EXPECTED[fn] in source
    assert " / 3.0f" in source and "1.0f / (" in source
    if vector:
        assert "float4" in source


def test_math_kernels_compile(nvcc_compile):
    sources = [(f"{fn}_{vector}", generate_cuda(math_kernel(fn, vector),
                                                name=f"math_{fn}_{int(vector)}").source)
               for fn in MATH_FUNCS for vector in (False, True)]
    nvcc_compile(sources)
