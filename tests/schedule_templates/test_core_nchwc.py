"""Blocked (NCHW[b]c) convolutions: keys, the reference's padding rules, and the x86 templates
on model-like layers (the contract suites run them on their workloads' examples too)."""

import numpy as np
import pytest

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.ir.printer import format_kernel
from schedule_templates.runtime import build
from schedule_templates.templates.base import get_template
from schedule_templates.templates.x86_conv2d_nchwc import pack_blocked_weight
from schedule_templates.templates.x86_depthwise_nchwc import pack_blocked_depthwise
from schedule_templates.workloads import parse_workload
from schedule_templates.workloads.conv_nchwc import from_blocked, to_blocked


def run_default(key: str, threads: int = 1, seed: int = 5) -> tuple[np.ndarray, np.ndarray]:
    workload = parse_workload(key)
    template = get_template(workload.op)
    artifact = build(workload, template, template.default_config(workload), threads=threads)
    try:
        inputs = workload.make_inputs(seed)
        prepared = artifact.prepare(inputs)
        prepared.run()
        return prepared.output.copy(), workload.reference(inputs)
    finally:
        artifact.close()


def test_keys_carry_the_block_and_never_match_nchw_keys():
    key = "conv2d_nchwc:N=1,C=32,H=14,W=14,K=64,R=1,S=1,block=8,epilogue=bias+relu"
    workload = parse_workload(key)
    assert workload.key == key and workload.base_key.endswith("block=8")
    assert parse_workload(key.replace("block=8", "block=16")).key != key
    with pytest.raises(InvalidWorkloadError, match="block"):
        parse_workload("conv2d_nchwc:N=1,C=32,H=14,W=14,K=64,R=1,S=1,block=6")
    with pytest.raises(InvalidWorkloadError, match="missing"):
        parse_workload("conv2d_nchwc:N=1,C=32,H=14,W=14,K=64,R=1,S=1")


def test_blocked_shapes_pad_channels_to_whole_blocks():
    workload = parse_workload("conv2d_nchwc:N=2,C=11,H=5,W=6,K=20,R=3,S=3,pad=1,block=8,"
                              "epilogue=scale+bias+residual")
    shapes = workload.input_shapes()
    assert shapes["data"] == (2, 2, 5, 6, 8) and shapes["weight"] == (20, 11, 3, 3)
    assert shapes["scale"] == shapes["bias"] == (24,)
    assert shapes["residual"] == workload.output_shape() == (2, 3, 5, 6, 8)


def test_plain_input_layout_is_its_own_key_and_fits_one_block():
    key = "conv2d_nchwc:N=1,C=3,H=16,W=16,K=32,R=3,S=3,stride=2,pad=1,in_layout=nchw,block=16"
    workload = parse_workload(key)
    assert workload.key == key and workload.plain_in
    assert workload.input_shapes()["data"] == (1, 3, 16, 16)
    blocked = parse_workload(key.replace("in_layout=nchw,", ""))
    assert not blocked.plain_in and blocked.input_shapes()["data"] == (1, 1, 16, 16, 16)
    inputs = workload.make_inputs(3)
    same = dict(inputs, data=to_blocked(inputs["data"], 16))
    np.testing.assert_array_equal(workload.reference(inputs), blocked.reference(same))
    with pytest.raises(InvalidWorkloadError, match="one block"):
        parse_workload(key.replace("C=3", "C=17"))
    with pytest.raises(InvalidWorkloadError, match="in_layout"):
        parse_workload(key.replace("in_layout=nchw", "in_layout=nhwc"))


def test_reference_is_the_nchw_convolution_and_ignores_padded_input_lanes():
    workload = parse_workload("conv2d_nchwc:N=1,C=5,H=7,W=7,K=9,R=3,S=3,stride=2,pad=1,block=4")
    inputs = workload.make_inputs(1)
    plain = workload.plain()
    expected = plain.reference({"data": from_blocked(inputs["data"], 5),
                                "weight": inputs["weight"]})
    got = workload.reference(inputs)
    np.testing.assert_array_equal(from_blocked(got, 9), expected)
    np.testing.assert_array_equal(got[:, 2, :, :, 1:], 0.0)  # no epilogue: padded lanes zero
    inputs["data"][:, 1, :, :, 1:] = 1e30  # padding of the input: changes nothing
    np.testing.assert_array_equal(workload.reference(inputs), got)


def test_padded_output_lanes_hold_the_epilogue_of_zero():
    workload = parse_workload("depthwise_conv2d_nchwc:N=1,C=3,H=5,W=5,R=3,S=3,pad=1,block=4,"
                              "epilogue=bias+sigmoid")
    inputs = workload.make_inputs(2)
    got = workload.reference(inputs)
    lane = 1.0 / (1.0 + np.exp(-inputs["bias"][3]))
    np.testing.assert_allclose(got[:, 0, :, :, 3], lane, rtol=1e-6)


def test_helpers_round_trip():
    x = np.random.default_rng(0).standard_normal((2, 13, 3, 4)).astype(np.float32)
    blocked = to_blocked(x, 8)
    assert blocked.shape == (2, 2, 3, 4, 8)
    np.testing.assert_array_equal(blocked[:, 1, :, :, 5:], 0.0)
    np.testing.assert_array_equal(from_blocked(blocked, 13), x)


def test_packed_weights_are_zero_outside_the_real_channels():
    weight = np.ones((10, 3, 1, 1), np.float32)
    packed = pack_blocked_weight(weight, 4, 1)  # (ko, cb, r, s, c, kbt, k)
    assert packed.shape == (3, 1, 1, 1, 4, 1, 4)
    assert packed.sum() == 30 and packed[2, 0, 0, 0, :, 0, 2:].sum() == 0
    assert packed[0, 0, 0, 0, 3].sum() == 0  # input lane 3 is padding
    depthwise = pack_blocked_depthwise(np.ones((5, 1, 3, 3), np.float32), 4)
    assert depthwise.shape == (2, 3, 3, 4) and depthwise[1, :, :, 1:].sum() == 0


@pytest.mark.parametrize("key", [
    # MobileNet-v2 / EfficientNet-like layers, channel counts not multiples of the block
    "conv2d_nchwc:N=1,C=144,H=14,W=14,K=40,R=1,S=1,block=8,epilogue=scale+bias",
    "conv2d_nchwc:N=1,C=3,H=32,W=32,K=32,R=3,S=3,stride=2,pad=1,block=8,epilogue=bias+relu6",
    "conv2d_nchwc:N=1,C=96,H=7,W=7,K=20,R=1,S=1,block=16,epilogue=bias+residual",
    "depthwise_conv2d_nchwc:N=1,C=60,H=7,W=7,R=3,S=3,pad=1,block=8,epilogue=bias+relu6",
    "depthwise_conv2d_nchwc:N=1,C=36,H=15,W=15,R=5,S=5,stride=2,pad=2,block=8,epilogue=silu",
    "depthwise_conv2d_nchwc:N=1,C=32,H=112,W=112,R=3,S=3,pad=1,block=8",  # plane > stack
    # RGB stems reading the plain input (padded and not)
    "conv2d_nchwc:N=1,C=3,H=33,W=30,K=32,R=3,S=3,stride=2,pad=1,in_layout=nchw,block=16,"
    "epilogue=bias+silu",
    "conv2d_nchwc:N=1,C=3,H=23,W=23,K=24,R=7,S=7,stride=2,pad=3,in_layout=nchw,block=8",
    "conv2d_nchwc:N=2,C=4,H=9,W=12,K=20,R=2,S=2,stride=2,in_layout=nchw,block=8,"
    "epilogue=bias+relu",
])
def test_default_configs_on_model_layers_match_numpy(key):
    for threads in (1, 2):
        got, expected = run_default(key, threads)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("key", [
    # planes too large for the stack: copied band by band (stride 2, asymmetric padding,
    # dilation, a 5x5 window, the bands at the bottom edge)
    "depthwise_conv2d_nchwc:N=1,C=24,H=101,W=97,R=3,S=3,stride=2,pad=1,block=8,"
    "epilogue=bias+relu6",
    "depthwise_conv2d_nchwc:N=2,C=8,H=96,W=90,R=3,S=3,stride=2,pad=0x1x1x0,block=8",
    "depthwise_conv2d_nchwc:N=1,C=16,H=92,W=95,R=5,S=5,pad=2,block=8,epilogue=silu",
    "depthwise_conv2d_nchwc:N=1,C=16,H=94,W=93,R=3,S=3,pad=2,dilation=2,block=8",
])
def test_banded_copies_match_numpy_under_random_tilings(key):
    workload = parse_workload(key)
    template = get_template(workload.op)
    space = template.space(workload)
    rng = np.random.default_rng(11)
    inputs = workload.make_inputs(4)
    expected = workload.reference(inputs)
    configs = [space.get(i) for i in space.sample(40, rng)]
    banded = [c for c in configs if c["local_copy"]][:3]
    assert banded
    for config in banded:
        assert "band" in format_kernel(template.lower(workload, config))
        artifact = build(workload, template, config, threads=2)
        try:
            prepared = artifact.prepare(inputs)
            prepared.run()
            np.testing.assert_allclose(prepared.output, expected, rtol=1e-4, atol=2e-5,
                                       err_msg=str(config))
        finally:
            artifact.close()


def test_a_band_too_wide_for_the_stack_falls_back_to_the_workspace():
    key = "depthwise_conv2d_nchwc:N=1,C=16,H=5,W=1500,R=3,S=3,pad=1,block=16"
    workload = parse_workload(key)
    template = get_template(workload.op)
    config = template.default_config(workload)
    assert config["local_copy"]
    text = format_kernel(template.lower(workload, config))
    assert "band" not in text and "data_pad" in text
    got, expected = run_default(key)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=2e-5)


def test_narrow_rows_get_wide_tiles_without_a_divisor():
    """A 7-wide map is two tiles (4 + 3), not seven 1-pixel ones."""
    for key in ("conv2d_nchwc:N=1,C=64,H=7,W=7,K=64,R=1,S=1,block=8",
                "depthwise_conv2d_nchwc:N=1,C=64,H=7,W=7,R=3,S=3,pad=1,block=8"):
        workload = parse_workload(key)
        assert get_template(workload.op).default_config(workload)["ow_t"] >= 4
