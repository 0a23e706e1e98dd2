"""Grouped convolutions on blocked activations (``group_conv2d_nchwc``): where group boundaries
meet block boundaries, the template's tiles, packed weights and refusals. (The contract suite
in test_core_templates runs the template on its workload's examples with random configs.)"""

from __future__ import annotations

import numpy as np
import pytest

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.runtime import build
from schedule_templates.templates.base import get_template
from schedule_templates.templates.x86_group_conv_nchwc import pack_grouped_weight
from schedule_templates.workloads import parse_workload
from schedule_templates.workloads.conv_nchwc import to_blocked
from schedule_templates.workloads.group_nchwc import GroupWindow, group_window

REGNET = ("group_conv2d_nchwc:N=1,C=104,H=15,W=15,K=104,R=3,S=3,stride=2,pad=1,groups=13,"
          "block=16,epilogue=bias+relu")


@pytest.mark.parametrize("c, k, groups, block, kbt, window", [
    (48, 48, 6, 16, 1, GroupWindow(1, 1, 1)),    # two groups of 8 a block: one input block
    (48, 48, 6, 16, 3, GroupWindow(3, 1, 3)),    # three output blocks read three input blocks
    (104, 104, 13, 16, 1, GroupWindow(1, 1, 1)),  # 6.5 blocks: the last one half padding
    (64, 64, 2, 16, 1, GroupWindow(2, 2, 2)),    # a group of 32 covers two tiles
    (16, 32, 2, 8, 1, GroupWindow(1, 2, 1)),     # 8 inputs to 16 outputs a group
    (48, 48, 4, 16, 1, None),                    # groups of 12 cross block boundaries
    (64, 64, 2, 16, 4, GroupWindow(4, 1, 4)),    # a tile of both groups reads every block
    (96, 96, 2, 16, 2, None),                    # tiles of 32 in groups of 48
    (48, 48, 6, 16, 2, None),                    # two tiles in three blocks
])
def test_group_window(c: int, k: int, groups: int, block: int, kbt: int,
                      window: GroupWindow | None) -> None:
    assert group_window(c, k, groups, block, kbt) == window


def test_unaligned_groups_are_refused_clearly() -> None:
    with pytest.raises(InvalidWorkloadError, match="do not meet blocks of 16"):
        parse_workload("group_conv2d_nchwc:N=1,C=48,H=8,W=8,K=48,R=3,S=3,pad=1,groups=4,"
                       "block=16")
    with pytest.raises(InvalidWorkloadError, match="depthwise"):
        parse_workload("group_conv2d_nchwc:N=1,C=16,H=8,W=8,K=16,R=3,S=3,groups=16,block=16")


def test_shapes_keep_the_onnx_weight_and_pad_channels() -> None:
    wl = parse_workload(REGNET)
    shapes = wl.input_shapes()
    assert shapes["data"] == (1, 7, 15, 15, 16) and shapes["weight"] == (104, 8, 3, 3)
    assert shapes["bias"] == (112,) and wl.output_shape() == (1, 7, 8, 8, 16)
    assert wl.flops() == wl.plain().flops()  # useful work, not the zeros of other groups


def test_packed_weights_are_zero_outside_each_lanes_group() -> None:
    wl = parse_workload(REGNET)
    weight = np.ones(wl.input_shapes()["weight"], np.float32)
    packed = pack_grouped_weight(wl, weight, 1)  # [tile][span][r][s][in lane][kbt][out lane]
    assert packed.shape == (7, 1, 3, 3, 16, 1, 16)
    lanes = packed[0, 0, 0, 0, :, 0, :]
    same_group = (np.arange(16)[:, None] // 8) == (np.arange(16)[None, :] // 8)
    np.testing.assert_array_equal(lanes, same_group.astype(np.float32))
    # the last block's second half is channel padding (104 = 6.5 blocks): zero both ways
    np.testing.assert_array_equal(packed[6, 0, 0, 0, 8:, 0, :], 0.0)
    np.testing.assert_array_equal(packed[6, 0, 0, 0, :, 0, 8:], 0.0)


def test_space_keeps_only_tiles_that_meet_groups_and_default_wastes_least() -> None:
    template = get_template("group_conv2d_nchwc")
    narrow = parse_workload(REGNET)
    space = template.space(narrow)
    sampled = [space.get(i) for i in space.sample(64, np.random.default_rng(0))]
    assert sampled and {c["tile_kb"][1] for c in sampled} == {1}  # 7 blocks: 1 or 7
    assert template.default_config(narrow)["tile_kb"] == (7, 1)
    wide = parse_workload("group_conv2d_nchwc:N=1,C=96,H=14,W=14,K=96,R=3,S=3,pad=1,"
                          "groups=2,block=16")
    assert template.default_config(wide)["tile_kb"] == (2, 3)  # a group of 48: no waste


@pytest.mark.parametrize("threads", [1, 2])
def test_regnet_layer_matches_the_plain_grouped_convolution(threads: int) -> None:
    wl = parse_workload(REGNET)
    template = get_template(wl.op)
    inputs = wl.make_inputs(7)
    inputs["data"][:, 6, :, :, 8:] = 1e30  # padded input lanes: never read as channels
    artifact = build(wl, template, template.default_config(wl), threads=threads)
    try:
        prepared = artifact.prepare(inputs)
        prepared.run()
        got = prepared.output.copy()
    finally:
        artifact.close()
    plain = wl.plain()
    data = np.asarray(inputs["data"]).transpose(0, 1, 4, 2, 3).reshape(1, 112, 15, 15)[:, :104]
    expected = plain.reference({"data": data, "weight": inputs["weight"]})
    expected = np.maximum(expected + inputs["bias"][:104, None, None], 0.0)
    assert got.shape == (1, 7, 8, 8, 16)
    blocked_expected = to_blocked(expected, 16)
    np.testing.assert_allclose(got[:, :6], blocked_expected[:, :6], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[:, 6, :, :, :8], blocked_expected[:, 6, :, :, :8],
                               rtol=1e-5, atol=1e-5)
