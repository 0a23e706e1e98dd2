"""Grouped convolution: keys, the numpy reference, and group_conv2d.x86 against numpy on odd
shapes with both vectorized axes, both reduction orders and fused epilogues."""

import numpy as np
import pytest

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.features import FeatureExtractor
from schedule_templates.runtime import build
from schedule_templates.templates.base import get_template
from schedule_templates.templates.x86_group_conv import vector_lanes
from schedule_templates.workloads import GroupConv2d, parse_workload

#: groups 2/4/8 and 3, channels per group 2..16 in and 1..16 out, odd H/W, stride, padding,
#: dilation, a batch of two and a 1-D convolution (H = 1)
SHAPES = [
    "group_conv2d:N=1,C=16,H=11,W=13,K=32,R=3,S=3,pad=1,groups=2",
    "group_conv2d:N=1,C=16,H=9,W=15,K=16,R=3,S=3,stride=2,pad=1,groups=4",
    "group_conv2d:N=2,C=16,H=9,W=11,K=24,R=3,S=2,stride=2x1,pad=0x1x2x0,dilation=2x1,groups=8",
    "group_conv2d:N=1,C=8,H=7,W=7,K=4,R=3,S=3,pad=2,dilation=2,groups=4",
    "group_conv2d:N=1,C=24,H=5,W=17,K=12,R=1,S=1,stride=2,groups=3",
    "group_conv2d:N=1,C=32,H=1,W=29,K=64,R=1,S=5,stride=1x2,pad=0x2x0x2,groups=8",
]
EPILOGUES = ["scale+bias+residual+relu", "bias+relu6", "bias+clip(-0.25:0.5)"]


def config_for(workload, **chosen):
    """A valid config of the space with the given knob values (the first such index)."""
    template = get_template(workload.op)
    space = template.space(workload)
    for index in range(space.size):
        config = space.get(index)
        if space.is_valid(index) and all(config[k] == v for k, v in chosen.items()):
            return config
    raise AssertionError(f"no valid config with {chosen}")


def run(workload, config, threads=1):
    template = get_template(workload.op)
    artifact = build(workload, template, config, threads=threads)
    try:
        inputs = workload.make_inputs(5)
        prepared = artifact.prepare(inputs)
        prepared.run()
        reduction = workload.flops() / (2 * np.prod(workload.output_shape()))
        np.testing.assert_allclose(prepared.output, workload.reference(inputs), rtol=1e-4,
                                   atol=1e-5 * np.sqrt(reduction) + 1e-6,
                                   err_msg=f"{workload.key} config {config.index}")
    finally:
        artifact.close()


@pytest.mark.parametrize("key", SHAPES)
@pytest.mark.parametrize("vector", ["k", "w"])
@pytest.mark.parametrize("reduce_order", ["c_rs", "rs_c"])
def test_both_vector_axes_and_orders_match_numpy(key, vector, reduce_order):
    workload = parse_workload(key)
    space = get_template(workload.op).space(workload)
    rng = np.random.default_rng(sum(map(ord, key + vector + reduce_order)))
    picks = [i for i in space.sample(60, rng)
             if space.get(i)["vector"] == vector and space.get(i)["reduce_order"] == reduce_order]
    assert picks, "the sample covers every vector axis and order"
    run(workload, space.get(picks[0]), threads=2)


@pytest.mark.parametrize("key", SHAPES[:4])
@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_fused_epilogues_match_numpy(key, epilogue):
    workload = parse_workload(f"{key},epilogue={epilogue}")
    run(workload, get_template(workload.op).default_config(workload))
    run(workload, config_for(workload, vector="w" if
                             get_template(workload.op).default_config(workload)["vector"] == "k"
                             else "k"))


def test_wide_tile_over_rows_and_channels():
    workload = parse_workload("group_conv2d:N=1,C=32,H=9,W=21,K=32,R=3,S=3,pad=1,groups=2")
    run(workload, config_for(workload, vector="w", tile_k=(4, 4), tile_oh=(3, 3),
                             tile_ow=(1, 21)))
    run(workload, config_for(workload, vector="k", tile_k=(1, 16), tile_oh=(9, 1),
                             tile_ow=(3, 7)))


@pytest.mark.parametrize(("key", "vector"), [
    ("group_conv2d:N=1,C=512,H=14,W=14,K=512,R=3,S=3,pad=1,groups=32", "k"),  # ResNeXt
    ("group_conv2d:N=1,C=128,H=56,W=56,K=128,R=3,S=3,pad=1,groups=32", "w"),  # 4 per group
    ("group_conv2d:N=1,C=48,H=56,W=56,K=48,R=3,S=3,stride=2,pad=1,groups=6", "k"),  # RegNet
    ("group_conv2d:N=1,C=48,H=28,W=28,K=48,R=3,S=3,pad=1,groups=6", "w"),
    ("group_conv2d:N=1,C=128,H=56,W=56,K=128,R=3,S=3,stride=2,pad=1,groups=32", "w"),
    ("group_conv2d:N=1,C=64,H=1,W=100,K=64,R=1,S=5,pad=0x2x0x2,groups=4", "k"),
])
def test_default_vectorizes_whole_groups_or_rows(key, vector):
    workload = parse_workload(key)
    template = get_template(workload.op)
    config = template.default_config(workload)
    template.check(workload, config)
    assert config["vector"] == vector


def test_keys_are_canonical_and_refuse_other_operators():
    workload = parse_workload("group_conv2d:groups=4,N=1,C=8,H=5,W=5,K=8,R=3,S=3,pad=1")
    assert workload.key == "group_conv2d:N=1,C=8,H=5,W=5,K=8,R=3,S=3,pad=1,groups=4"
    assert isinstance(workload, GroupConv2d)
    assert (workload.group_in, workload.group_out) == (2, 2)
    assert workload.input_shapes()["weight"] == (8, 2, 3, 3)
    assert workload.flops() == 2 * 8 * 25 * 2 * 9
    assert "4 groups" in workload.describe()
    fused = parse_workload(f"{workload.key},epilogue=bias+relu")
    assert fused.base_key == workload.key
    # conv2d keys never carry a group count: old keys keep their meaning and space
    with pytest.raises(InvalidWorkloadError, match="unknown parameter 'groups'"):
        parse_workload("conv2d:N=1,C=8,H=5,W=5,K=8,R=3,S=3,groups=2")


@pytest.mark.parametrize(("key", "message"), [
    ("group_conv2d:N=1,C=8,H=5,W=5,K=8,R=3,S=3", "missing"),
    ("group_conv2d:N=1,C=8,H=5,W=5,K=8,R=3,S=3,groups=1", "ordinary conv2d"),
    ("group_conv2d:N=1,C=8,H=5,W=5,K=16,R=3,S=3,groups=8", "depthwise_conv2d with multiplier=2"),
    ("group_conv2d:N=1,C=8,H=5,W=5,K=6,R=3,S=3,groups=4", "must divide"),
    ("group_conv2d:N=1,C=6,H=5,W=5,K=8,R=3,S=3,groups=4", "must divide"),
    ("group_conv2d:N=1,C=8,H=2,W=2,K=8,R=3,S=3,groups=2", "does not fit"),
])
def test_bad_group_keys_give_clear_errors(key, message):
    with pytest.raises(InvalidWorkloadError, match=message):
        parse_workload(key)


def test_reference_matches_torch_when_installed():
    torch = pytest.importorskip("torch")
    workload = parse_workload(SHAPES[2])
    inputs = workload.make_inputs(1)
    want = torch.nn.functional.conv2d(
        torch.from_numpy(np.pad(inputs["data"], ((0, 0), (0, 0), (0, 2), (1, 0)))),
        torch.from_numpy(inputs["weight"]), stride=workload.stride,
        dilation=workload.dilation, groups=workload.groups).numpy()
    np.testing.assert_allclose(workload.reference(inputs), want, rtol=1e-5, atol=1e-5)


def test_features_are_finite_for_both_vector_axes():
    for key in SHAPES[:2]:
        workload = parse_workload(key)
        fx = FeatureExtractor(get_template(workload.op), workload)
        indices = [config_for(workload, vector=v).index for v in ("k", "w")]
        x = fx.features(indices)
        assert np.isfinite(x).all()
        assert not np.array_equal(x[0], x[1])  # the two lowerings are told apart


def test_row_vectors_are_whole_native_vectors():
    assert [vector_lanes(w) for w in (1, 2, 4, 8, 16, 56, 64)] == [1, 2, 4, 8, 16, 56, 64]
    assert [vector_lanes(w) for w in (3, 5, 7, 12, 14, 28, 33)] == [4, 8, 8, 16, 16, 32, 40]


@pytest.mark.parametrize(("key", "owt"), [
    ("group_conv2d:N=1,C=16,H=6,W=21,K=16,R=1,S=3,groups=4", 19),  # unpadded: a copy for slack
    ("group_conv2d:N=1,C=16,H=6,W=14,K=16,R=3,S=3,pad=1,groups=8", 7),
    ("group_conv2d:N=2,C=12,H=9,W=27,K=12,R=3,S=3,stride=2,pad=1,groups=3", 14),
    ("group_conv2d:N=1,C=8,H=5,W=5,K=8,R=1,S=1,groups=2", 5),
])
def test_widened_rows_store_only_their_outputs(key, owt):
    workload = parse_workload(f"{key},epilogue=bias+residual+relu")
    config = config_for(workload, vector="w", tile_ow=(workload.out_w // owt, owt))
    run(workload, config, threads=2)
