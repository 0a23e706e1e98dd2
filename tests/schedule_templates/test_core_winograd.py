"""Winograd F(2x2)/F(4x4) lowerings of conv2d.x86: the transforms, the space, and numpy checks."""

import itertools

import numpy as np
import pytest

from schedule_templates.features import FeatureExtractor
from schedule_templates.runtime import build
from schedule_templates.templates.base import get_template
from schedule_templates.templates.choose import padded_spatial
from schedule_templates.templates.x86_winograd import ALGORITHMS, MATRICES
from schedule_templates.workloads import parse_workload
from workers.measure.runner import compare_output

TEMPLATE = get_template("conv2d")


@pytest.mark.parametrize("m", sorted(MATRICES))
def test_the_transforms_compute_a_correlation(m):
    bt, g, at = (np.array(x, dtype=np.float64) for x in MATRICES[m])
    rng = np.random.default_rng(m)
    for _ in range(5):
        d, w = rng.standard_normal(m + 2), rng.standard_normal(3)
        expected = np.array([d[i:i + 3] @ w for i in range(m)])
        np.testing.assert_allclose(at @ ((g @ w) * (bt @ d)), expected, rtol=1e-12, atol=1e-12)


def winograd_config(workload, algorithm, kt, rows, group=1, reduce_order="c_rs",
                    outer_order="k_h"):
    space = TEMPLATE.space(workload)
    default = dict((n, v) for n, _, v in TEMPLATE.default_config(workload).entities)
    values = dict(default, algorithm=algorithm, reduce_order=reduce_order,
                  outer_order=outer_order, tile_k=(workload.K // kt, kt),
                  tile_ow=(padded_spatial(workload.out_w) // rows, rows),
                  tile_oh=(padded_spatial(workload.out_h) // group, group))
    config = space.from_entities(values)
    assert space.is_valid(config.index)
    return config


def run(workload, config, threads=1):
    artifact = build(workload, TEMPLATE, config, threads=threads)
    try:
        inputs = workload.make_inputs(5)
        prepared = artifact.prepare(inputs)
        prepared.run()
        first = prepared.output.copy()
        prepared.run()  # a second call reuses the workspaces: same answer
        np.testing.assert_array_equal(prepared.output, first)

        class Bound:
            output = prepared.output
            reduction_length = workload.C * workload.R * workload.S

            @staticmethod
            def expected():
                return workload.reference(inputs)
        return compare_output(Bound)  # the worker's own check (rtol 1e-3)
    finally:
        artifact.close()


CASES = [
    # tiles divide the output, clipped tiles, padding 0 and uneven, batch 2, odd channels
    ("conv2d:N=1,C=16,H=8,W=8,K=32,R=3,S=3,pad=1", 16, 4),
    ("conv2d:N=1,C=32,H=7,W=7,K=32,R=3,S=3,pad=1", 32, 7),
    ("conv2d:N=2,C=24,H=11,W=9,K=40,R=3,S=3,pad=0x1x2x0", 8, 4),
    ("conv2d:N=1,C=3,H=10,W=13,K=8,R=3,S=3", 8, 6),  # 11 wide: split as 12
]


@pytest.mark.parametrize(("key", "kt", "rows"), CASES)
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_winograd_matches_numpy(key, kt, rows, algorithm):
    workload = parse_workload(key)
    assert run(workload, winograd_config(workload, algorithm, kt, rows)) is None


@pytest.mark.parametrize(("reduce_order", "outer_order", "group"),
                         list(itertools.product(("c_rs", "rs_c"), ("k_h", "h_k"), (1, 2))))
def test_every_loop_order_and_fused_epilogue(reduce_order, outer_order, group):
    workload = parse_workload(
        "conv2d:N=1,C=16,H=12,W=12,K=32,R=3,S=3,pad=1,epilogue=scale+bias+residual+relu")
    config = winograd_config(workload, "winograd4", 16, 3, group, reduce_order, outer_order)
    assert run(workload, config, threads=2) is None


def test_only_3x3_stride_1_windows_offer_winograd():
    def options(key):
        return TEMPLATE.space(parse_workload(key)).knob("algorithm").entities
    assert options("conv2d:N=1,C=8,H=8,W=8,K=8,R=3,S=3,pad=1") == (
        "direct", "winograd2", "winograd4")
    for key in ("conv2d:N=1,C=8,H=8,W=8,K=8,R=3,S=3,stride=2,pad=1",
                "conv2d:N=1,C=8,H=8,W=8,K=8,R=1,S=1",
                "conv2d:N=1,C=8,H=8,W=8,K=8,R=3,S=3,dilation=2,pad=2"):
        assert options(key) == ("direct",)


def test_old_configs_keep_their_index():
    workload = parse_workload("conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1")
    space = TEMPLATE.space(workload)
    # a direct config (this layer's default is Winograd: test_core_defaults)
    default = space.from_entities(
        {**{n: v for n, _, v in TEMPLATE.default_config(workload).entities},
         "algorithm": "direct"})
    # a config recorded before the algorithm knob existed: no such entity, same index
    old = {"index": default.index,
           "entity": [e for e in default.to_json()["entity"] if e[0] != "algorithm"]}
    assert space.from_json(old).index == default.index
    # the new knob is the most significant digit: direct configs are the first third
    assert default.index < space.size // (len(ALGORITHMS) + 1)
    # Winograd ignores unroll_s: only one of its two settings is kept
    flipped = dict((n, v) for n, _, v in default.entities)
    flipped.update(algorithm="winograd2", unroll_s="none")
    assert not space.is_valid(space.from_entities(flipped).index)


def test_winograd_configs_have_features():
    workload = parse_workload("conv2d:N=1,C=16,H=8,W=8,K=32,R=3,S=3,pad=1")
    extractor = FeatureExtractor(TEMPLATE, workload)
    rows = extractor.features([winograd_config(workload, "winograd4", 16, 2).index,
                               TEMPLATE.default_config(workload).index])
    assert rows.shape[0] == 2 and np.isfinite(rows).all()
    assert not np.array_equal(rows[0], rows[1])
