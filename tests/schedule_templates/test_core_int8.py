"""int8 kernels on every x86 host: the vpmaddwd path (AVX2, AVX-512 without VNNI), padding of N
and K, the int32 bias, and ``conv2d_int8``. Outputs are compared exactly with the references.

Each kernel test runs with the host's own instruction and, on a VNNI host, again forced onto
vpmaddwd, so both paths are covered wherever VNNI exists."""

import ctypes

import numpy as np
import pytest

from schedule_templates.codegen.llvm_ir import generate_llvm_ir
from schedule_templates.codegen.llvm_jit import CompiledKernel
from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.ir.nodes import Buffer, Kernel, LoopKind, intrinsic, loop, store
from schedule_templates.runtime import aligned_empty, build
from schedule_templates.templates import x86_amx_gemm, x86_dot_gemm
from schedule_templates.templates.base import get_template
from schedule_templates.templates.x86_int8_phases import Geometry
from schedule_templates.workloads import parse_workload


def run(key, inputs=None, entities=None, threads=1):
    """(kernel output, reference, assembly) of one config (the default if not given)."""
    workload = parse_workload(key)
    template = get_template(workload.op)
    config = (template.default_config(workload) if entities is None
              else template.space(workload).from_entities(entities))
    artifact = build(workload, template, config, threads=threads)
    try:
        inputs = inputs or workload.make_inputs(7)
        prepared = artifact.prepare(inputs)
        prepared.run()
        return prepared.output.copy(), workload.reference(inputs), artifact.compiled.assembly()
    finally:
        artifact.close()


def _intrinsic_lanes(fn: str, start: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``fn(start, x, y)`` on 16 int32 lanes, by a generated kernel."""
    lanes = 16
    acc, xb, yb = (Buffer(n, (lanes,), dtype="int32") for n in ("acc", "x", "y"))
    v, vec = loop("v", lanes, LoopKind.VECTORIZE)
    kernel = Kernel(fn, (acc, xb, yb), (), (vec(store(acc[v], intrinsic(
        fn, acc[v], xb[v], yb[v]))),))
    arrays = [aligned_empty(lanes, dtype=np.int32) for _ in range(3)]
    for array, values in zip(arrays, (start, x, y), strict=True):
        array[:] = values
    compiled = CompiledKernel(generate_llvm_ir(kernel), kernel.name, 3)
    try:
        compiled.function(*[ctypes.c_void_p(a.ctypes.data) for a in arrays], 1)
    finally:
        compiled.close()
    return arrays[0]


def test_pmaddwd_is_exact_at_the_extremes_of_u8_times_s8():
    lanes = 16
    rng = np.random.default_rng(0)
    lo = rng.choice([0, 1, 254, 255], size=lanes).astype(np.int32)
    hi = rng.choice([0, 1, 254, 255], size=lanes).astype(np.int32)
    wlo = rng.choice([-128, -127, 127, 0], size=lanes).astype(np.int32)
    whi = rng.choice([-128, -127, 127, 1], size=lanes).astype(np.int32)
    start = rng.integers(-2**30, 2**30, size=lanes).astype(np.int32)
    got = _intrinsic_lanes("pmaddwd", start, (lo | (hi << 16)).astype(np.int32),
                           ((wlo & 0xFFFF) | (whi << 16)).astype(np.int32))
    np.testing.assert_array_equal(got, start.astype(np.int64) + lo * wlo + hi * whi)


@pytest.mark.parametrize("key", [
    "dense_int8:M=7,N=48,K=36",
    "dense_int8:M=5,N=33,K=13,out=s8",  # N and K padded, odd M
    "dense_int8:M=3,N=10,K=1,out=f32,scale=tensor",
    "dense_int8:M=6,N=1000,K=20,bias=s32",  # N=1000: the ImageNet classifier
    "dense_int8:M=1,N=17,K=7,out=s8,bias=s32",
])
def test_int8_dense_is_exact_on_any_shape(instruction, key):
    out, ref, _ = run(key)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("parallel", ["mn", "n"])
def test_int8_blocked_reduction_with_padded_columns(instruction, threads, parallel):
    # N=37 computed as 48, K=22 as 24 in three blocks: the workspace holds partial sums of the
    # padded columns, the last block requantizes, the real columns are copied out
    entities = {"tile_m": (3, 1, 3), "tile_n": (3, 1, 16), "tile_k": (3, 1, 2),
                "outer_order": "nm", "inner_order": "mn", "parallel": parallel}
    out, ref, _ = run("dense_int8:M=9,N=37,K=22,out=u8,bias=s32", entities=entities,
                      threads=threads)
    np.testing.assert_array_equal(out, ref)


def test_int8_ties_and_saturation_with_odd_k(instruction):
    workload = parse_workload("dense_int8:M=5,N=19,K=3,out=s8,scale=tensor")
    rng = np.random.default_rng(5)
    inputs = {
        "data": rng.integers(0, 4, size=(5, 3), dtype=np.uint8),
        "weight": rng.integers(-3, 4, size=(19, 3), dtype=np.int8),
        "data_zero_point": np.array([1], dtype=np.uint8),
        "scale": np.array([0.5], dtype=np.float32),  # every odd accumulator is a tie
        "out_zero_point": np.array([-126], dtype=np.int8),  # and negative ones saturate
    }
    inputs["data"][0] = 255  # large sums: the other end saturates too
    inputs["weight"][0] = -127
    out, ref, _ = run(workload.key, inputs)
    assert (workload.accumulate(inputs) % 2 == 1).any()
    assert (ref == -128).any()
    np.testing.assert_array_equal(out, ref)


def test_the_space_does_not_depend_on_the_instruction(monkeypatch):
    workload = parse_workload("dense_int8:M=12,N=40,K=30")
    template = get_template("dense_int8")
    host = template.space(workload)
    host_default = template.default_config(workload)
    monkeypatch.setattr(x86_dot_gemm, "int8_instruction", lambda narrow=False: x86_dot_gemm.PMADDWD)
    avx2 = template.space(workload)
    avx2_default = template.default_config(workload)
    assert avx2.dims == host.dims
    for config in (host_default, avx2_default):  # each host's default is valid on the other
        assert host.is_valid(config.index) and avx2.is_valid(config.index)
        assert avx2.get(config.index).entities == host.get(config.index).entities
    # vpmaddwd's default fits 16 ymm registers: 16-lane accumulators, at most 6 of them
    mr, nr = avx2_default["tile_m"][2], avx2_default["tile_n"][2]
    assert mr * nr // 16 <= 6


def test_avx2_takes_pixel_rows_of_five_on_small_maps(monkeypatch):
    """Without VNNI a 7x7 map runs as pixel rows of 5 x 16 (vpmaddwd's 6 accumulators hold
    them; channel rows would drop 15 of 64 columns), exactly."""
    monkeypatch.setattr(x86_dot_gemm, "int8_instruction", lambda narrow=False: (
        x86_dot_gemm.PMADDUBSW if narrow else x86_dot_gemm.PMADDWD))
    key = "conv2d_int8:N=1,C=128,H=7,W=7,K=32,R=3,S=3,pad=1,bias=s32"
    workload = parse_workload(key)
    assert get_template(workload.op).default_config(workload)["pk_tile"] == "5x16"
    out, ref, _ = run(key)
    np.testing.assert_array_equal(out, ref)


def test_avx2_hot_loop_is_vpmaddwd(monkeypatch):
    monkeypatch.setattr(x86_dot_gemm, "int8_instruction", lambda narrow=False: x86_dot_gemm.PMADDWD)
    _, _, asm = run("dense_int8:M=8,N=64,K=64")
    # on a CPU with AVX-512 VNNI (Zen 5) LLVM fuses vpmaddwd + vpaddd into vpdpwssd
    assert asm.count("vpmaddwd") + asm.count("vpdpwssd") >= 8
    assert "vpmulld" not in asm and "vfmadd" not in asm


@pytest.mark.parametrize("inst", [x86_dot_gemm.VNNI, x86_dot_gemm.PMADDWD],
                         ids=["bytes", "pairs"])
def test_word_rows_pack_values_little_end_first_and_zero_pad(inst):
    from schedule_templates.ir.nodes import cast
    from schedule_templates.templates.x86_int8_stages import word_rows

    rows, k = 3, 13
    words = 16 // inst.per_word  # K padded to 16: one word of zeros past the tail word
    data = Buffer("data", (rows, k), dtype="uint8")
    out = Buffer("out", (rows, words), dtype="int32")
    stage = word_rows(lambda m, w: out[m, w], lambda m, kk: cast("int32", data[m, kk]),
                      rows, k, words, inst)
    kernel = Kernel("words", (data, out), (), (stage,))
    source = aligned_empty(rows * k, dtype=np.uint8).reshape(rows, k)
    source[:] = np.random.default_rng(1).integers(0, 256, size=(rows, k))
    source[0, :4] = 255  # the top byte of a VNNI word sets its sign bit
    result = aligned_empty(rows * words, dtype=np.int32).reshape(rows, words)
    result[:] = -1
    compiled = CompiledKernel(generate_llvm_ir(kernel), kernel.name, 2)
    try:
        compiled.function(ctypes.c_void_p(source.ctypes.data),
                          ctypes.c_void_p(result.ctypes.data), 1)
    finally:
        compiled.close()
    padded = np.zeros((rows, 16), dtype=np.uint8 if inst.per_word == 4 else np.uint16)
    padded[:, :k] = source
    np.testing.assert_array_equal(result, padded.view(np.int32))


@pytest.mark.parametrize("key", ["dense_int8:M=5,N=33,K=13,out=s8",
                                 "dense_int8:M=4,N=32,K=64,bias=s32",
                                 "conv2d_int8:N=1,C=6,H=9,W=8,K=16,R=3,S=3,stride=2,pad=1"])
def test_vnni_kernels_compile_for_a_vnni_cpu(monkeypatch, key):
    """Where this host cannot run VNNI, its kernels (padding stages included) still compile for
    a CPU that has it, to vpdpbusd."""
    import llvmlite.binding as llvm

    from schedule_templates.codegen.llvm_jit import _initialize, optimize
    from schedule_templates.runtime import lower

    monkeypatch.setattr(x86_dot_gemm, "int8_instruction", lambda narrow=False: x86_dot_gemm.VNNI)
    monkeypatch.setattr(x86_amx_gemm, "host_amx", lambda dot="tdpbusd": False)
    workload = parse_workload(key)
    template = get_template(workload.op)
    kernel = lower(workload, template, template.default_config(workload))
    _initialize()
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu="icelake-server", features="+avx512f,+avx512bw,+avx512vnni", opt=3)
    asm = machine.emit_assembly(optimize(str(generate_llvm_ir(kernel)), machine))
    assert asm.count("vpdpbusd") >= 4 and "vpmaddwd" not in asm


# --- conv2d_int8 -------------------------------------------------------------------------------

def _direct_conv_accumulators(workload, inputs):
    """The int32 accumulators by the definition, one output at a time (small shapes only)."""
    data = inputs["data"].astype(np.int64) - int(inputs["data_zero_point"][0])
    weight = inputs["weight"].astype(np.int64)
    top, left, _, _ = workload.pad
    out = np.zeros(workload.output_shape(), dtype=np.int64)
    for n, k, oh, ow in np.ndindex(*out.shape):
        g = k // workload.group_out
        total = int(inputs["bias"][k]) if workload.bias == "s32" else 0
        for c, r, s in np.ndindex(workload.group_in, workload.R, workload.S):
            ih = oh * workload.stride[0] + r * workload.dilation[0] - top
            iw = ow * workload.stride[1] + s * workload.dilation[1] - left
            if 0 <= ih < workload.H and 0 <= iw < workload.W:
                total += data[n, g * workload.group_in + c, ih, iw] * weight[k, c, r, s]
        out[n, k, oh, ow] = total
    return out


@pytest.mark.parametrize("key", [
    "conv2d_int8:N=1,C=8,H=8,W=6,K=12,R=3,S=2,stride=2x1,pad=0x1x1x0,groups=4,bias=s32",
    "conv2d_int8:N=2,C=5,H=7,W=6,K=3,R=3,S=3,stride=2,pad=2x1x0x2,dilation=2",
])
def test_conv_int8_reference_is_the_definition(key):
    workload = parse_workload(key)
    inputs = workload.make_inputs(2)
    np.testing.assert_array_equal(workload.accumulate(inputs),
                                  _direct_conv_accumulators(workload, inputs))


@pytest.mark.parametrize("key", [
    "conv2d_int8:N=1,C=8,H=7,W=9,K=16,R=3,S=3,pad=1",
    "conv2d_int8:N=1,C=16,H=8,W=8,K=32,R=1,S=1,bias=s32",  # pixels stored in place
    "conv2d_int8:N=3,C=8,H=8,W=4,K=12,R=1,S=1,groups=4,out=f32",  # in place, per image, group
    "conv2d_int8:N=1,C=12,H=6,W=5,K=20,R=1,S=1,out=s8,scale=tensor,bias=s32",
    "conv2d_int8:N=2,C=6,H=9,W=8,K=10,R=3,S=3,stride=2,pad=1,out=f32",
    "conv2d_int8:N=1,C=16,H=7,W=7,K=16,R=3,S=3,pad=1,groups=16,bias=s32",  # depthwise
    "conv2d_int8:N=1,C=8,H=9,W=9,K=16,R=3,S=3,stride=2,pad=1,groups=8",  # depthwise x2
    "conv2d_int8:N=2,C=4,H=9,W=10,K=4,R=5,S=3,stride=2x1,pad=2x1x0x1,dilation=1x2,groups=4,"
    "out=s8,scale=tensor",
    "conv2d_int8:N=1,C=8,H=8,W=6,K=12,R=3,S=2,stride=2x1,pad=0x1x1x0,groups=4",
    "conv2d_int8:N=2,C=5,H=11,W=10,K=7,R=3,S=3,stride=2,pad=1,dilation=2,out=s8",
    "conv2d_int8:N=1,C=3,H=15,W=13,K=8,R=7,S=7,stride=2,pad=3",  # a ResNet stem
    # the input stage's paths: one phase of four (strided 1x1), rows long enough for 16-lane
    # pieces between the padded borders, odd widths and channels past whole words
    "conv2d_int8:N=1,C=6,H=9,W=7,K=8,R=1,S=1,stride=2,bias=s32",
    "conv2d_int8:N=1,C=5,H=6,W=37,K=8,R=3,S=3,pad=1",
    "conv2d_int8:N=2,C=9,H=5,W=41,K=8,R=3,S=3,stride=2,pad=1x2x0x1",
    # 64 input channels a group and more: AMX tiles where the host has them (a step of 64
    # channels inside one tap; output channels padded to whole blocks, odd pixel counts)
    "conv2d_int8:N=1,C=64,H=9,W=7,K=40,R=3,S=3,pad=1,bias=s32",
    "conv2d_int8:N=2,C=128,H=7,W=7,K=16,R=1,S=1,out=s8,scale=tensor",
    "conv2d_int8:N=1,C=64,H=11,W=10,K=64,R=3,S=3,stride=2,pad=1,out=f32",
    "conv2d_int8:N=1,C=128,H=8,W=8,K=96,R=1,S=1,stride=2,bias=s32",
    "conv2d_int8:N=1,C=128,H=6,W=5,K=32,R=3,S=3,pad=1,groups=2,bias=s32",
    # fewer than 64 channels in one group: expanded planes on AMX (one plane per reduction
    # word, padded to whole steps), stored in place where the pixels are whole blocks of 32,
    # with the shortcut added (and hinted a line ahead) in place
    "conv2d_int8:N=2,C=32,H=8,W=8,K=48,R=1,S=1,bias=s32,residual=u8",
    "conv2d_int8:N=1,C=24,H=8,W=4,K=16,R=3,S=3,pad=1,out=s8,residual=s8",
    "conv2d_int8:N=2,C=3,H=24,W=22,K=40,R=7,S=7,stride=2,pad=3,bias=s32",
])
def test_conv_int8_is_exact(instruction, key):
    out, ref, _ = run(key)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("threads", [1, 2])
def test_conv_int8_stem_on_threads(instruction, threads):
    out, ref, _ = run("conv2d_int8:N=1,C=3,H=40,W=40,K=64,R=7,S=7,stride=2,pad=3,bias=s32",
                      threads=threads)
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("threads", [1, 2])
def test_conv_int8_blocked_reduction_and_threads(instruction, threads):
    # 3x3 taps x 8 channels = 72 values = 18 groups in three blocks; 2 output channel blocks;
    # 7 rows of 10 (padded width) = 70 pixels computed as 96 (three tiles of 32)
    entities = {"tile_m": (2, 1, 4), "tile_n": (3, 1, 32), "tile_k": (3, 3, 2),
                "outer_order": "mn", "inner_order": "nm", "parallel": "mn"}
    out, ref, _ = run("conv2d_int8:N=2,C=8,H=7,W=8,K=8,R=3,S=3,pad=1,out=s8,bias=s32",
                      entities=entities, threads=threads)
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("key", [
    # 1x1 windows: the tile rows hold the pixels in NCHW order and are copied flat (63 pixels
    # of 64 columns; 35 of 48 for the stride-2 one), the fused addition on the copy
    "conv2d_int8:N=2,C=16,H=7,W=9,K=32,R=1,S=1,bias=s32,residual=u8",
    "conv2d_int8:N=1,C=8,H=10,W=14,K=16,R=1,S=1,stride=2,out=s8,bias=s32,residual=s8",
    "conv2d_int8:N=1,C=12,H=7,W=7,K=32,R=1,S=1,groups=2,out=f32",
    "conv2d_int8:N=1,C=64,H=7,W=7,K=32,R=1,S=1,bias=s32,residual=u8",  # tiles on AMX
    "conv2d_int8:N=1,C=64,H=14,W=14,K=64,R=1,S=1,out=s8,residual=s8",  # in place
])
@pytest.mark.parametrize("threads", [1, 2])
def test_conv_int8_one_by_one_copies_flat_rows(instruction, key, threads):
    workload = parse_workload(key)
    entities = {name: value for name, _, value in
                get_template("conv2d_int8").default_config(workload).entities}
    entities["pk_tile"] = "none"  # channel rows, whatever the host's default
    columns = Geometry(workload, x86_dot_gemm.VNNI).columns
    entities["tile_n"] = (columns // 16, 1, 16)
    entities["tile_m"] = (workload.group_out // 8, 1, 8)
    out, ref, _ = run(key, entities=entities, threads=threads)
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("groups", [1, 4])
def test_conv_int8_padding_is_the_zero_point(instruction, groups):
    # all activations equal to the zero point: every output is the bias alone, padding too
    workload = parse_workload(f"conv2d_int8:N=1,C=4,H=5,W=5,K=16,R=3,S=3,pad=1,groups={groups},"
                              "bias=s32,out=f32")
    inputs = workload.make_inputs(4)
    inputs["data"][:] = inputs["data_zero_point"][0]
    out, ref, _ = run(workload.key, inputs)
    expected = inputs["bias"].astype(np.float32) * inputs["scale"]
    np.testing.assert_array_equal(ref, np.broadcast_to(expected[None, :, None, None],
                                                       ref.shape))
    np.testing.assert_array_equal(out, ref)


def test_depthwise_int8_uses_int32_vectors_not_padded_words():
    workload = parse_workload("conv2d_int8:N=1,C=32,H=10,W=10,K=32,R=3,S=3,pad=1,groups=32")
    template = get_template("conv2d_int8")
    assert template.space(workload).knob("tile_n")  # its own space: pixel blocks only
    _, _, asm = run(workload.key)
    assert "vpmulld" in asm and "vpmaddwd" not in asm and "vpdpbusd" not in asm


def _two_steps(key, inputs, bias_side):
    """The unfused path: the product's kernel to 8 bits, then the glue kernel adding the 8-bit
    bias ``inputs["add_bytes"]`` (the first operand when ``bias_side`` is "a")."""
    from schedule_templates.ops.quant import QuantizedBinary
    from schedule_templates.ops.run import compile_op

    fused = parse_workload(key)
    base = fused.base_workload()
    q, _, _ = run(base.key, {k: v for k, v in inputs.items() if k in base.input_shapes()})
    scales, zps = inputs["add_scale"], inputs["add_zero_point"]
    b_scale, b_zp = inputs["add_bytes_scale"], inputs["add_bytes_zero_point"]
    kind = {"u8": "uint8", "s8": "int8"}
    q_side = (kind[base.out], float(scales[0]), int(zps[0]))
    b_side = (str(inputs["add_bytes"].dtype), b_scale, b_zp)
    first, second = (b_side, q_side) if bias_side == "a" else (q_side, b_side)
    op = QuantizedBinary(q.size, *first, *second, kind[fused.add], float(scales[1]), int(zps[1]),
                         broadcast=bias_side, period=fused.N)
    operands = {bias_side: inputs["add_bytes"], "b" if bias_side == "a" else "a": q.reshape(-1)}
    compiled = compile_op(op)
    try:
        return compiled(operands).reshape(q.shape)
    finally:
        compiled.close()


def _with_bias_bytes(workload, seed, dtype="uint8"):
    """Inputs of a fused workload whose ``add_value`` is an 8-bit bias dequantized the way the
    model compiler does it (``frontend.quantized_bias``)."""
    rng = np.random.default_rng(seed)
    inputs = workload.make_inputs(seed)
    lo, hi = (0, 255) if dtype == "uint8" else (-128, 127)
    inputs["add_bytes"] = rng.integers(lo, hi + 1, size=workload.N).astype(dtype)
    inputs["add_bytes_scale"] = float(np.float32(rng.uniform(0.005, 0.02)))
    inputs["add_bytes_zero_point"] = int(rng.integers(lo, hi + 1))
    value = inputs["add_bytes"].astype(np.float32)
    value -= np.float32(inputs["add_bytes_zero_point"])
    value *= np.float32(inputs["add_bytes_scale"])
    inputs["add_value"] = value
    return inputs


@pytest.mark.parametrize("key", [
    "dense_int8:M=7,N=33,K=13,bias=s32,add=u8",  # N and K padded
    "dense_int8:M=5,N=20,K=12,out=s8,scale=tensor,add=s8",
    "dense_int8:M=1,N=48,K=64,add=u8",  # VNNI reads the data in place
    "dense_int8:M=3,N=17,K=5,out=u8,add=s8",
    "dense_int8:M=9,N=64,K=40,out=s8,add=u8",
])
@pytest.mark.parametrize("bias_side", ["a", "b"])
def test_fused_bias_add_is_the_two_steps_bit_for_bit(instruction, key, bias_side):
    """The dense_int8 kernel with the quantized addition in its output stage gives the bytes of
    the product's kernel followed by the glue kernel, whichever operand the bias was."""
    workload = parse_workload(key)
    inputs = _with_bias_bytes(workload, 5, "int8" if key.endswith("s8") else "uint8")
    want = _two_steps(key, inputs, bias_side)
    out, ref, _ = run(key, {k: v for k, v in inputs.items() if k in workload.input_shapes()})
    assert out.dtype == want.dtype == ref.dtype and out.shape == want.shape
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(ref, want)
    assert len(np.unique(out)) > 8  # not all saturated


def test_fused_bias_add_rounds_like_the_glue_not_like_an_fma(instruction):
    """A product's output of 175 plus a bias of 24 at the glue test's parameters sums to
    3.9749997 in two fp32 roundings (output 91) and to 3.975 in one (an FMA: 92)."""
    key = "dense_int8:M=2,N=16,K=4,scale=tensor,bias=s32,add=u8"
    workload = parse_workload(key)
    inputs = workload.make_inputs(0)
    inputs["weight"][:] = 0
    inputs["bias"][:] = 175
    inputs["scale"][:] = 1.0
    inputs["out_zero_point"][:] = 0
    inputs["add_scale"] = np.array([0.0371, 0.05], np.float32)
    inputs["add_zero_point"] = np.array([7, 12], np.int32)
    inputs["add_value"] = np.full(16, (np.float32(24) - np.float32(130)) * np.float32(0.0213),
                                  np.float32)
    out, ref, _ = run(key, inputs)
    assert (out == 91).all() and (ref == 91).all()


def test_a_fused_add_shares_the_products_records():
    fused = parse_workload("dense_int8:M=7,N=33,K=13,bias=s32,add=u8")
    assert fused.base_key == "dense_int8:M=7,N=33,K=13,bias=s32"
    template = get_template("dense_int8")
    assert template.space(fused).size == template.space(fused.base_workload()).size
    assert template.default_config(fused).index == template.default_config(
        fused.base_workload()).index
    with pytest.raises(InvalidWorkloadError, match="add"):
        parse_workload("dense_int8:M=7,N=33,K=13,out=f32,add=u8")
