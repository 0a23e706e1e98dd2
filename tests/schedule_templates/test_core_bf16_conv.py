"""``conv2d_bf16``: its reference, the x86 kernel on odd geometries, blocked reductions, both
output paths (in place, and a workspace copied out with the epilogue), and the hot loop's
instruction. Kernels skip (with the reason) on CPUs without AVX-512 BF16."""

import numpy as np
import pytest

from schedule_templates.templates.base import get_template
from schedule_templates.templates.x86_dot_gemm import BF16
from schedule_templates.templates.x86_int8_phases import Geometry, group_slots
from schedule_templates.workloads import parse_workload
from schedule_templates.workloads.lowp import from_bfloat16, to_bfloat16
from tests.schedule_templates.test_core_lowp import needs_bf16, run

CONV = "conv2d:N=1,C=5,H=9,W=7,K=12,R=3,S=3,stride=2,pad=1x0x1x2,epilogue=bias+relu"


def test_reference_is_conv2d_on_bfloat16_values():
    fp32 = parse_workload(CONV)
    bf16 = parse_workload(CONV.replace("conv2d:", "conv2d_bf16:"))
    inputs = fp32.make_inputs(0)
    rounded = {**inputs, "data": from_bfloat16(to_bfloat16(inputs["data"])),
               "weight": from_bfloat16(to_bfloat16(inputs["weight"]))}
    np.testing.assert_allclose(bf16.reference(inputs), fp32.reference(rounded),
                               rtol=1e-5, atol=1e-5)
    # and it is not the fp32 result: the rounding is really there
    assert np.abs(bf16.reference(inputs) - fp32.reference(inputs)).max() > 1e-4


def test_shapes_follow_conv2d_and_groups_divide_the_channels():
    bf16 = parse_workload("conv2d_bf16:N=2,C=8,H=6,W=5,K=12,R=3,S=1,groups=4,epilogue=bias")
    assert bf16.input_shapes() == {"data": (2, 8, 6, 5), "weight": (12, 2, 3, 1),
                                   "bias": (12,)}
    assert bf16.output_shape() == (2, 12, 4, 5)
    assert bf16.flops() == 2 * 2 * 12 * 4 * 5 * 2 * 3
    with pytest.raises(Exception, match="groups"):
        parse_workload("conv2d_bf16:N=1,C=6,H=4,W=4,K=8,R=1,S=1,groups=4")


@needs_bf16
@pytest.mark.parametrize("key", [
    # channel pairs padded (odd C), asymmetric padding, stride 2: four phases, copied out
    "conv2d_bf16:N=1,C=5,H=9,W=7,K=12,R=3,S=3,stride=2,pad=1x0x1x2,epilogue=bias+relu",
    # the columns are exactly the pixels: the epilogue (residual too) in the register tile
    "conv2d_bf16:N=2,C=6,H=4,W=8,K=16,R=1,S=1,epilogue=scale+bias+residual+relu",
    # dilation, a smooth activation applied on the copy
    "conv2d_bf16:N=1,C=4,H=9,W=9,K=16,R=3,S=3,pad=2,dilation=2,epilogue=bias+gelu",
    # a strided 1x1 reads one phase of four; groups
    "conv2d_bf16:N=1,C=8,H=10,W=10,K=24,R=1,S=1,stride=2",
    "conv2d_bf16:N=2,C=8,H=8,W=6,K=12,R=3,S=2,stride=2x1,pad=0x1x1x0,groups=4,epilogue=bias",
    # fewer than 32 channels in one group: expanded planes on AMX (an RGB stem copied out; a
    # map of whole 32-pixel blocks stored in place with its residual)
    "conv2d_bf16:N=2,C=3,H=20,W=18,K=40,R=7,S=7,stride=2,pad=3,epilogue=bias+relu",
    "conv2d_bf16:N=1,C=16,H=8,W=8,K=32,R=3,S=3,pad=1,epilogue=bias+residual",
])
@pytest.mark.parametrize("threads", [1, 2])
def test_default_config_matches_the_rounded_reference(key, threads):
    out, ref, _ = run(key, threads=threads)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@needs_bf16
@pytest.mark.parametrize("parallel", ["mn", "m", "n"])
def test_blocked_reduction_keeps_partial_sums(parallel):
    # 9 taps x 8 channel pairs = 72 words in 3 K blocks through the partial-sum workspace
    key = "conv2d_bf16:N=1,C=16,H=7,W=7,K=32,R=3,S=3,pad=1,epilogue=bias+residual"
    workload = parse_workload(key)
    columns = Geometry(workload, BF16).columns
    entities = {"tile_m": (2, 2, 8), "tile_n": (columns // 16, 1, 16), "tile_k": (3, 6, 4),
                "outer_order": "mn", "inner_order": "nm", "parallel": parallel}
    out, ref, _ = run(key, entities=entities, threads=2)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@needs_bf16
def test_hot_loop_runs_on_vdpbf16ps(monkeypatch):
    from schedule_templates.templates import x86_amx_gemm

    # the vector kernel (on an AMX host 32 channels go to tiles: tests/.../test_amx.py)
    monkeypatch.setattr(x86_amx_gemm, "host_amx", lambda dot="tdpbusd": False)
    _, _, asm = run("conv2d_bf16:N=1,C=32,H=8,W=8,K=32,R=1,S=1")
    assert asm.count("vdpbf16ps") >= 4
    assert "vfmadd" not in asm


def test_space_counts_channel_pairs():
    workload = parse_workload("conv2d_bf16:N=1,C=5,H=8,W=8,K=16,R=3,S=3,pad=1")
    geo = Geometry(workload, BF16)
    assert (geo.channel_words, geo.words, geo.reduction) == (3, 27, 54)
    space = get_template("conv2d_bf16").space(workload)
    assert space.size > 1 and get_template("conv2d_bf16").default_config(workload) is not None


def pixel_rows(key, pk, **entities):
    workload = parse_workload(key)
    geo = Geometry(workload, BF16)
    return {"tile_m": (workload.K // workload.groups, 1, 1),
            "tile_n": (geo.columns // 16, 1, 16), "tile_k": (1, geo.words // 2, 2),
            "outer_order": "nm", "inner_order": "nm", "parallel": "mn",
            "pk_tile": pk, **entities}


@needs_bf16
@pytest.mark.parametrize("pk, threads", [("7x32", 1), ("4x64", 2), ("12x16", 2)])
def test_pixel_rows_match_the_rounded_reference(pk, threads):
    # 49 pixels: the last register tile's extra rows are computed and never stored; the
    # epilogue (residual too) on each lane's own output pixel
    key = "conv2d_bf16:N=2,C=24,H=7,W=7,K=64,R=3,S=3,pad=1,epilogue=bias+residual+relu"
    out, ref, _ = run(key, entities=pixel_rows(key, pk), threads=threads)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@needs_bf16
def test_pixel_rows_blocked_reduction_and_groups():
    key = "conv2d_bf16:N=1,C=32,H=5,W=6,K=64,R=3,S=3,pad=1,stride=1,groups=2,epilogue=bias"
    entities = pixel_rows(key, "6x32", tile_k=(3, 12, 2), parallel="n")  # 72 words
    out, ref, _ = run(key, entities=entities, threads=2)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_small_maps_default_to_pixel_rows():
    template = get_template("conv2d_bf16")
    small = parse_workload("conv2d_bf16:N=1,C=512,H=7,W=7,K=512,R=3,S=3,pad=1")
    large = parse_workload("conv2d_bf16:N=1,C=64,H=56,W=56,K=256,R=1,S=1")
    assert template.default_config(small)["pk_tile"] != "none"
    assert template.default_config(large)["pk_tile"] == "none"


@needs_bf16
@pytest.mark.parametrize("key, pk", [
    ("conv2d_bf16:N=1,C=104,H=8,W=8,K=104,R=3,S=3,pad=1,groups=13,epilogue=bias+relu", None),
    ("conv2d_bf16:N=2,C=32,H=4,W=8,K=32,R=1,S=1,groups=4,epilogue=bias+residual", None),
    ("conv2d_bf16:N=2,C=64,H=7,W=7,K=64,R=3,S=3,pad=1,groups=2,epilogue=bias", "7x32"),
])
def test_groups_split_between_threads(key, pk):
    # from GROUP_SPLIT (image, group) GEMMs on, each thread runs whole groups in a workspace of
    # its own: copied out, in place and as pixel rows
    workload = parse_workload(key)
    assert group_slots(workload, get_template("conv2d_bf16").default_config(workload)) > 1
    out, ref, _ = run(key, entities=None if pk is None else pixel_rows(key, pk), threads=2)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("key", [
    "conv2d_int8:N=1,C=64,H=9,W=9,K=64,R=3,S=3,pad=1,groups=8,bias=s32",
    "conv2d_int8:N=2,C=32,H=4,W=8,K=32,R=1,S=1,groups=2,bias=s32,residual=u8",
])
def test_int8_groups_split_between_threads_stay_exact(key):
    out, ref, _ = run(key, threads=2)
    np.testing.assert_array_equal(out, ref)


@needs_bf16
def test_expanded_padding_planes_are_zeroed_not_read_stale():
    """The planes that pad an expanded geometry's words meet zero weights; a NaN left there
    (bits of a reused workspace) would still poison every sum, so the kernel zeroes them."""
    from schedule_templates import runtime
    from schedule_templates.templates import x86_amx_gemm

    if not x86_amx_gemm.host_amx("tdpbf16ps"):
        pytest.skip("this host (CPU or kernel) grants no AMX-BF16 tiles")
    workload = parse_workload("conv2d_bf16:N=1,C=3,H=16,W=16,K=32,R=3,S=3,pad=1")
    template = get_template(workload.op)
    artifact = runtime.build(workload, template, template.default_config(workload))
    inputs = workload.make_inputs(3)
    prepared = artifact.prepare(inputs)
    workspaces = prepared._args[len(artifact.kernel.params):]
    assert workspaces  # the phase planes and the expanded planes
    for workspace in workspaces:
        workspace.view(np.uint8)[:] = 0xFF  # NaN bits everywhere
    prepared.run()
    np.testing.assert_allclose(prepared.output, workload.reference(inputs), rtol=1e-5,
                               atol=1e-5)
