"""Low precision: int8 and bf16 dense kernels, their references, and the IR dtypes under them.
Integer outputs are compared exactly; bf16 within fp32 summation-order tolerance. int8 runs on
every x86 host (VNNI where it has it, else vpmaddwd); bf16 kernels skip (with the reason) on
CPUs without AVX-512 BF16."""

import ctypes
import dataclasses
import math

import numpy as np
import pytest

from schedule_templates.codegen.llvm_ir import generate_llvm_ir
from schedule_templates.codegen.llvm_jit import CompiledKernel, host_features
from schedule_templates.errors import (
    CodegenError,
    InvalidConfigError,
    InvalidWorkloadError,
    UnsupportedHostError,
)
from schedule_templates.ir.nodes import Buffer, Kernel, LoopKind, cast, intrinsic, loop, store
from schedule_templates.runtime import aligned_empty, build
from schedule_templates.templates.base import get_template
from schedule_templates.workloads import parse_workload
from schedule_templates.workloads.epilogue import NO_EPILOGUE
from schedule_templates.workloads.lowp import from_bfloat16, requantize, to_bfloat16

FEATURES = set(host_features().split(","))
needs_vnni = pytest.mark.skipif("+avx512vnni" not in FEATURES,
                                reason="this CPU lacks AVX-512 VNNI (vpdpbusd)")
needs_bf16 = pytest.mark.skipif("+avx512bf16" not in FEATURES,
                                reason="this CPU lacks AVX-512 BF16 (vdpbf16ps)")


def run_kernel(kernel, arrays):
    compiled = CompiledKernel(generate_llvm_ir(kernel), kernel.name, len(arrays))
    try:
        compiled.function(*[ctypes.c_void_p(a.ctypes.data) for a in arrays], 1)
    finally:
        compiled.close()


def run(key, inputs=None, entities=None, threads=1):
    """(kernel output, reference, hot-loop assembly) of one config (default if not given)."""
    workload = parse_workload(key)
    template = get_template(workload.op)
    space = template.space(workload)
    config = template.default_config(workload) if entities is None else space.from_entities(
        entities)
    artifact = build(workload, template, config, threads=threads)
    try:
        inputs = inputs or workload.make_inputs(3)
        prepared = artifact.prepare(inputs)
        prepared.run()
        return prepared.output.copy(), workload.reference(inputs), artifact.compiled.assembly()
    finally:
        artifact.close()


# --- references --------------------------------------------------------------------------------

def test_requantize_rounds_half_to_even_then_saturates():
    acc = np.array([5, 7, -5, -7, 1000, -1000, 3], dtype=np.int32)
    out = requantize(acc, np.float32(0.5), 10, "s8")
    # 2.5 -> 2, 3.5 -> 4, -2.5 -> -2, -3.5 -> -4 (half to even), then + 10, then [-128, 127]
    assert out.tolist() == [12, 14, 8, 6, 127, -128, 12]
    assert out.dtype == np.int8
    assert requantize(acc, np.float32(0.5), 0, "u8").tolist() == [2, 4, 0, 0, 255, 0, 2]
    np.testing.assert_array_equal(requantize(acc, np.float32(0.5), None, "f32"), acc * 0.5)


def test_bfloat16_rounding_is_nearest_even():
    one = np.float32(1.0).view(np.uint32)
    cases = np.array([one, one + 0x8000, one + 0x18000, one + 0x8001, one + 0x7FFF],
                     dtype=np.uint32).view(np.float32)
    # exact; tie to even (down); tie to even (up); above the tie; below the tie
    assert to_bfloat16(cases).tolist() == [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x3F80]
    np.testing.assert_array_equal(from_bfloat16(to_bfloat16(np.float32([1.5, -2.0]))),
                                  [1.5, -2.0])


def test_int8_reference_is_the_exact_integer_computation():
    workload = parse_workload("dense_int8:M=3,N=16,K=8,out=f32,scale=tensor")
    inputs = workload.make_inputs(1)
    zp = int(inputs["data_zero_point"][0])
    acc = (inputs["data"].astype(np.int64) - zp) @ inputs["weight"].astype(np.int64).T
    np.testing.assert_array_equal(workload.accumulate(inputs), acc)


def test_low_precision_keys_are_their_own_operators():
    assert parse_workload("dense_int8:M=2,N=16,K=4").key == "dense_int8:M=2,N=16,K=4"
    key = "dense_int8:M=2,N=16,K=4,out=s8,scale=tensor"
    assert parse_workload(key).key == key
    with pytest.raises(InvalidWorkloadError, match="not one of u8, s8, f32"):
        parse_workload("dense_int8:M=2,N=16,K=4,out=u4")
    # int8 pads N and K (tests in test_core_int8.py); bf16 still needs whole pairs of K
    get_template("dense_int8").space(parse_workload("dense_int8:M=2,N=10,K=5"))
    with pytest.raises(InvalidWorkloadError, match="multiple of 2"):
        get_template("dense_bf16").space(parse_workload("dense_bf16:M=2,N=16,K=5"))


# --- kernels -----------------------------------------------------------------------------------

@pytest.mark.parametrize("key", [
    "dense_int8:M=7,N=48,K=36",
    "dense_int8:M=4,N=32,K=64,out=s8,scale=tensor",
    "dense_int8:M=6,N=64,K=16,out=f32",
])
def test_int8_default_config_is_exact(key):
    out, ref, _ = run(key)
    assert out.dtype == ref.dtype
    np.testing.assert_array_equal(out, ref)


def test_int8_ties_round_to_even_and_saturate_like_the_reference():
    workload = parse_workload("dense_int8:M=4,N=16,K=4,out=u8,scale=tensor")
    rng = np.random.default_rng(5)
    inputs = {
        "data": rng.integers(0, 4, size=(4, 4), dtype=np.uint8),
        "weight": rng.integers(-3, 4, size=(16, 4), dtype=np.int8),
        "data_zero_point": np.array([1], dtype=np.uint8),
        "scale": np.array([0.5], dtype=np.float32),  # every odd accumulator is a tie
        "out_zero_point": np.array([3], dtype=np.uint8),  # and negative ones saturate at 0
    }
    out, ref, _ = run(workload.key, inputs)
    assert (workload.accumulate(inputs) % 2 == 1).any()
    assert (ref == 0).any()
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("parallel", ["mn", "m", "n"])
def test_int8_blocked_reduction_keeps_partial_sums_exact(threads, parallel):
    # three K blocks: partial sums go through the workspace, the last block requantizes
    entities = {"tile_m": (2, 1, 4), "tile_n": (2, 1, 16), "tile_k": (3, 2, 2),
                "outer_order": "mn", "inner_order": "mn", "parallel": parallel}
    out, ref, _ = run("dense_int8:M=8,N=32,K=48,out=s8", entities=entities, threads=threads)
    np.testing.assert_array_equal(out, ref)


@needs_bf16
@pytest.mark.parametrize("key, entities", [
    ("dense_bf16:M=5,N=32,K=40", None),
    ("dense_bf16:M=8,N=48,K=64", {"tile_m": (2, 2, 2), "tile_n": (1, 1, 48),
                                  "tile_k": (4, 2, 4), "outer_order": "nm",
                                  "inner_order": "mn", "parallel": "m"}),
])
def test_bf16_matches_the_rounded_reference(key, entities):
    out, ref, _ = run(key, entities=entities)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@needs_bf16
@pytest.mark.parametrize("threads", [1, 2])
def test_bf16_rounds_fp32_activations_in_the_kernel(threads):
    # data=f32: the kernel rounds the rows into its workspace, then a blocked reduction and the
    # fused epilogue in fp32; the same numbers as the bf16-data kernel on pre-rounded rows
    entities = {"tile_m": (7, 1, 1), "tile_n": (1, 2, 16), "tile_k": (3, 2, 2),
                "outer_order": "mn", "inner_order": "nm", "parallel": "mn"}
    key = "dense_bf16:M=7,N=32,K=24,data=f32,epilogue=scale+bias+residual+relu"
    out, ref, _ = run(key, entities=entities, threads=threads)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    workload = parse_workload(key)
    inputs = workload.make_inputs(0)
    assert inputs["data"].dtype == np.float32
    plain = dataclasses.replace(workload, data="bf16", epilogue=NO_EPILOGUE)
    rounded = plain.reference({"data": to_bfloat16(inputs["data"]), "weight": inputs["weight"]})
    np.testing.assert_allclose(np.maximum(rounded * inputs["scale"] + inputs["bias"]
                                          + inputs["residual"], 0.0),
                               workload.reference(inputs), rtol=1e-6, atol=1e-6)


@needs_bf16
def test_bf16_rows_past_m_are_computed_but_never_stored() -> None:
    # M=19 is computed as 24 rows (whole register tiles); rows 19..23 must not be stored, or
    # the output's neighbours would change; the fused GELU stays vectorized (outside the test)
    key = "dense_bf16:M=19,N=48,K=20,data=f32,epilogue=bias+residual+gelu"
    workload = parse_workload(key)
    assert math.prod(get_template("dense_bf16").default_config(workload)["tile_m"]) == 24
    entities = {"tile_m": (3, 1, 8), "tile_n": (1, 3, 16), "tile_k": (2, 5, 1),
                "outer_order": "mn", "inner_order": "mn", "parallel": "mn"}
    out, ref, _ = run(key, entities=entities, threads=2)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@needs_vnni
@needs_bf16
@pytest.mark.parametrize("key, instruction", [
    ("dense_int8:M=8,N=64,K=64", "vpdpbusd"),
    ("dense_bf16:M=8,N=64,K=64", "vdpbf16ps"),
])
def test_hot_loop_uses_the_dot_product_instruction(key, instruction, monkeypatch):
    from schedule_templates.templates import x86_amx_gemm

    # the vector kernel (on an AMX host these shapes go to tiles: tests/.../test_amx.py)
    monkeypatch.setattr(x86_amx_gemm, "host_amx", lambda dot="tdpbusd": False)
    _, _, asm = run(key)
    assert asm.count(instruction) >= 4  # one per accumulator register at least
    assert "vfmadd" not in asm


def test_build_refuses_a_host_without_the_features(monkeypatch):
    import schedule_templates.runtime as runtime

    monkeypatch.setattr(runtime, "host_features", lambda: "+avx512f,-avx512bf16")
    workload = parse_workload("dense_bf16:M=2,N=16,K=4")
    template = get_template("dense_bf16")
    with pytest.raises(UnsupportedHostError, match="host lacks: avx512bf16"):
        build(workload, template, template.default_config(workload))


def test_low_precision_arguments_are_never_converted():
    workload = parse_workload("dense_int8:M=2,N=16,K=4")
    template = get_template("dense_int8")
    artifact = build(workload, template, template.default_config(workload))
    try:
        inputs = workload.make_inputs(0)
        inputs["scale"] = inputs["scale"].astype(np.float64)  # fp32 buffers convert as ever
        artifact.prepare(inputs)
        inputs["data"] = inputs["data"].astype(np.float32)
        with pytest.raises(InvalidConfigError, match="input data is float32, expected uint8"):
            artifact.prepare(inputs)
    finally:
        artifact.close()


# --- IR dtypes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("vector", [False, True])
def test_casts_between_element_types(vector):
    n = 16
    src = Buffer("src", (n,))
    bf = Buffer("bf", (n,), dtype="bfloat16")
    back = Buffer("back", (n,))
    s8 = Buffer("s8", (n,), dtype="int8")
    widened = Buffer("widened", (n,), dtype="int32")
    v, mk = loop("v", n, LoopKind.VECTORIZE if vector else LoopKind.SERIAL)
    body = mk(
        store(bf[v], cast("bfloat16", src[v])),
        store(back[v], cast("float32", bf[v])),
        store(s8[v], cast("int8", cast("int32", intrinsic("roundeven", src[v] * 100.0)))),
        store(widened[v], cast("int32", s8[v]) * 2),
    )
    kernel = Kernel("casts", (src, bf, back, s8, widened), (), (body,))
    x = aligned_empty(n)
    x[:] = np.linspace(-1.0, 1.0, n, dtype=np.float32) + np.float32(1e-3)
    outs = [aligned_empty(n, zero=True, dtype=t) for t in (np.uint16, np.float32, np.int8,
                                                             np.int32)]
    run_kernel(kernel, [x, *outs])
    np.testing.assert_array_equal(outs[0], to_bfloat16(x))
    np.testing.assert_array_equal(outs[1], from_bfloat16(to_bfloat16(x)))
    np.testing.assert_array_equal(outs[2], np.rint(x * np.float32(100.0)).astype(np.int8))
    np.testing.assert_array_equal(outs[3], outs[2].astype(np.int32) * 2)


@pytest.mark.parametrize("vector", [False, True])
def test_rounding_to_int32_is_one_conversion_to_nearest_even(vector):
    """``int32(roundeven(x))`` is emitted as ``llvm.lrint`` (x86 ``cvtps2dq``, the rounding
    mode's nearest even): ties go to the even neighbour, as numpy's ``rint``."""
    n = 16
    src = Buffer("src", (n,))
    out = Buffer("out", (n,), dtype="int32")
    v, mk = loop("v", n, LoopKind.VECTORIZE if vector else LoopKind.SERIAL)
    kernel = Kernel("rint", (src, out), (),
                    (mk(store(out[v], cast("int32", intrinsic("roundeven", src[v])))),))
    assert "llvm.lrint" in str(generate_llvm_ir(kernel))
    x = aligned_empty(n)
    x[:] = [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, -3.49, 3.51, 1e6 + 0.5, -7.0, 0.0,
            126.5, 127.5, -128.5, 254.5]
    got = aligned_empty(n, zero=True, dtype=np.int32)
    run_kernel(kernel, [x, got])
    np.testing.assert_array_equal(got, np.rint(x).astype(np.int32))


def test_bfloat16_to_an_integer_gives_its_bits():
    n = 16
    src = Buffer("src", (n,))
    bits = Buffer("bits", (n,), dtype="int32")
    v, mk = loop("v", n, LoopKind.VECTORIZE)
    kernel = Kernel("bits", (src, bits), (), (mk(store(bits[v], cast("int32", cast(
        "bfloat16", src[v])))),))
    x = aligned_empty(n)
    x[:] = np.linspace(-3.0, 3.0, n, dtype=np.float32)
    out = aligned_empty(n, zero=True, dtype=np.int32)
    run_kernel(kernel, [x, out])
    np.testing.assert_array_equal(out, to_bfloat16(x).astype(np.int32))


def test_fixed_width_intrinsic_outside_a_vector_loop_is_a_clear_error():
    a = Buffer("a", (4,), dtype="int32")
    i, mk = loop("i", 4)
    kernel = Kernel("scalar_vnni", (a,), (), (mk(store(a[i], intrinsic("vpdpbusd", a[i], a[i],
                                                                         a[i]))),))
    with pytest.raises(CodegenError, match="16 lanes"):
        generate_llvm_ir(kernel)


def test_intrinsic_arguments_are_type_checked():
    f = Buffer("f", (4,))
    with pytest.raises(ValueError, match="vpdpbusd takes"):
        intrinsic("vpdpbusd", f[0], f[0], f[0])
    with pytest.raises(ValueError, match="unknown dtype"):
        Buffer("x", (4,), dtype="float16")
