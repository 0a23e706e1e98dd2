"""int8 in onnxruntime's arithmetic without VNNI (``weights=sat16``): each pair of byte products
along the reduction summed on saturating 16 bits (``vpmaddubsw``), on every host; the reference
saturates the same pairs, and it differs from the exact sums where it should."""

import dataclasses

import numpy as np
import pytest

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.templates import x86_dot_gemm
from schedule_templates.workloads import parse_workload
from schedule_templates.workloads.lowp import INT16_MAX, INT16_MIN, sat16_correction
from tests.schedule_templates.test_core_int8 import _intrinsic_lanes, run

KEYS = [
    "dense_int8:M=5,N=40,K=22,bias=s32,weights=sat16",
    "dense_int8:M=7,N=33,K=13,out=s8,weights=sat16",  # an odd K's last byte pairs with a zero
    "dense_int8:M=6,N=64,K=64,out=f32,weights=sat16",
    "dense_int8:M=7,N=33,K=13,bias=s32,add=u8,weights=sat16",
    "conv2d_int8:N=1,C=4,H=15,W=15,K=16,R=7,S=7,stride=2,pad=3,weights=sat16",
    "conv2d_int8:N=1,C=12,H=9,W=7,K=16,R=3,S=3,stride=2,pad=1,groups=2,weights=sat16",
    "conv2d_int8:N=1,C=64,H=14,W=14,K=48,R=3,S=3,stride=2,pad=1,weights=sat16,residual=s8",
    "conv2d_int8:N=1,C=16,H=7,W=7,K=32,R=1,S=1,bias=s32,weights=sat16,residual=u8",
    "conv2d_int8:N=1,C=16,H=8,W=8,K=32,R=3,S=3,pad=1,in_layout=nhwc,out_layout=nhwc,"
    "weights=sat16",
    # odd channel counts: the window's values in flat words, pairs across taps
    "conv2d_int8:N=2,C=3,H=20,W=19,K=24,R=7,S=7,stride=2,pad=3,bias=s32,out=s8,weights=sat16",
    "conv2d_int8:N=1,C=5,H=11,W=10,K=32,R=3,S=3,stride=2,pad=1,bias=s32,weights=sat16",
    "conv2d_int8:N=1,C=3,H=16,W=16,K=16,R=3,S=3,pad=1,dilation=2,residual=u8,weights=sat16",
    "conv2d_int8:N=1,C=1,H=12,W=12,K=16,R=5,S=5,pad=2,weights=sat16",
]


def test_pmaddubsw_saturates_pairs_as_the_reference_does():
    """255 x 127 twice is past int16: the lane keeps 32767 (and -32768 below), as onnxruntime's
    vpmaddubsw does; the reference's correction takes exactly what saturation takes."""
    lanes = 16
    data = np.full((lanes, 4), 255, dtype=np.uint8)
    weight = np.tile(np.array([127, 127, -128, -128], dtype=np.int8), (lanes, 1))
    weight[1] = [127, -127, 1, 0]  # opposite signs never saturate
    start = np.zeros(lanes, dtype=np.int32)
    got = _intrinsic_lanes("pmaddubsw", start, data.view(np.int32).reshape(-1),
                           weight.view(np.int32).reshape(-1))
    assert got[0] == INT16_MAX + INT16_MIN
    assert got[1] == 255 * (127 - 127 + 1)
    exact = (data.astype(np.int64) * weight).sum(axis=1)
    np.testing.assert_array_equal(got, exact + sat16_correction(data, weight).diagonal())


@pytest.mark.parametrize("key", KEYS)
def test_sat16_kernels_match_the_saturating_reference(instruction, key):
    out, ref, asm = run(key)
    np.testing.assert_array_equal(out, ref)
    assert "vpmaddubsw" in asm  # whatever the host's own int8 instruction


@pytest.mark.parametrize("key", [KEYS[0], KEYS[6]])
def test_sat16_reference_differs_from_the_exact_sums(key):
    """Random full-range weights and bytes saturate many pairs: the two arithmetics part."""
    workload = parse_workload(key)
    inputs = workload.make_inputs(3)
    exact = dataclasses.replace(workload, weights="full")
    assert np.mean(workload.accumulate(inputs) != exact.accumulate(inputs)) > 0.1
    narrow = dict(inputs, weight=np.clip(inputs["weight"], -64, 64))
    np.testing.assert_array_equal(workload.accumulate(narrow), exact.accumulate(narrow))


def test_sat16_runs_on_vpmaddubsw_even_where_vnni_is(monkeypatch):
    monkeypatch.setattr(x86_dot_gemm, "int8_instruction", lambda narrow=False: x86_dot_gemm.VNNI)
    workload = parse_workload(KEYS[0])
    assert x86_dot_gemm.workload_instruction(workload) is x86_dot_gemm.PMADDUBSW
    assert x86_dot_gemm.workload_instruction(
        dataclasses.replace(workload, weights="full")) is x86_dot_gemm.VNNI


@pytest.mark.parametrize("key", [
    "conv2d_int8:N=1,C=6,H=9,W=9,K=16,R=3,S=3,groups=2,weights=sat16",  # 3 channels a group
    "conv2d_int8:N=1,C=8,H=9,W=9,K=8,R=3,S=3,groups=8,weights=sat16",  # depthwise
])
def test_grouped_sat16_needs_pairs_of_channels_within_a_tap(key):
    with pytest.raises(InvalidWorkloadError, match="even number"):
        parse_workload(key)


def test_an_odd_channel_count_pairs_values_across_taps():
    """A 3-channel stem's window walked tap by tap, channel by channel: value 2 of tap 0 and
    value 0 of tap 1 form a pair (onnxruntime's im2col); per-tap words would pair it with a
    zero, and the sums differ."""
    workload = parse_workload("conv2d_int8:N=1,C=3,H=3,W=3,K=1,R=1,S=2,weights=sat16")
    data = np.full((1, 3, 3, 3), 255, dtype=np.uint8)
    weight = np.zeros((1, 3, 1, 2), dtype=np.int8)
    weight[0, 2, 0, 0] = weight[0, 0, 0, 1] = 127  # channel 2 of tap 0, channel 0 of tap 1
    inputs = {"data": data, "weight": weight, "data_zero_point": np.zeros(1, np.uint8),
              "scale": np.ones(1, np.float32), "out_zero_point": np.zeros(1, np.uint8)}
    acc = workload.accumulate(inputs)
    np.testing.assert_array_equal(acc, np.full_like(acc, INT16_MAX))  # one saturated pair
    out, ref, _ = run(workload.key, inputs=inputs)
    np.testing.assert_array_equal(out, ref)


def test_flat_words_keep_nchw_activations():
    with pytest.raises(InvalidWorkloadError, match="keeps NCHW"):
        parse_workload("conv2d_int8:N=1,C=3,H=9,W=9,K=16,R=3,S=3,out_layout=nhwc,weights=sat16")
