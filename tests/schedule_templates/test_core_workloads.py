import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.workloads import make_workload, parse_workload


def naive_conv(data, weight, stride, pad, dilation, groups):
    n_, _, h_, w_ = data.shape
    k_, cg, r_, s_ = weight.shape
    top, left, bottom, right = pad
    x = np.pad(data, ((0, 0), (0, 0), (top, bottom), (left, right)))
    oh = (h_ + top + bottom - dilation[0] * (r_ - 1) - 1) // stride[0] + 1
    ow = (w_ + left + right - dilation[1] * (s_ - 1) - 1) // stride[1] + 1
    out = np.zeros((n_, k_, oh, ow), np.float64)
    per_group = k_ // groups
    for k in range(k_):
        g = k // per_group
        for y in range(oh):
            for x_ in range(ow):
                for c in range(cg):
                    for r in range(r_):
                        for s in range(s_):
                            row = y * stride[0] + r * dilation[0]
                            col = x_ * stride[1] + s * dilation[1]
                            out[:, k, y, x_] += x[:, g * cg + c, row, col] * weight[k, c, r, s]
    return out


def test_canonical_key_round_trips_and_omits_defaults():
    w = parse_workload("conv2d:pad=1,stride=1,N=1,C=64,H=56,W=56,K=64,R=3,S=3")
    assert w.key == "conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1"
    assert parse_workload(w.key) == w
    asym = parse_workload("conv2d:N=1,C=3,H=9,W=9,K=4,R=3,S=3,stride=2x1,pad=0x1x2x0")
    assert asym.stride == (2, 1) and asym.pad == (0, 1, 2, 0)
    assert parse_workload(asym.key) == asym


@pytest.mark.parametrize("key, message", [
    ("conv2d:N=1,C=1", "missing"),
    ("dense:M=1,N=2,K=3,Q=4", "unknown parameter 'Q'"),
    ("dense:M=0,N=1,K=1", "out of range"),
    ("dense:M=1,N=x,K=1", "not an integer"),
    ("dense:M=1,M=2,N=1,K=1", "given twice"),
    ("conv2d:N=1,C=1,H=2,W=2,K=1,R=5,S=5", "does not fit"),
    ("winograd:N=1", "unknown operator"),
    ("dense", "must look like"),
    ("dense:M=65536,N=65536,K=65536", "exceeds"),
    ("conv2d:N=1,C=1,H=4,W=4,K=1,R=3,S=3,stride=1x1x1", "needs"),
])
def test_bad_keys_give_clear_errors(key, message):
    with pytest.raises(InvalidWorkloadError, match=message):
        parse_workload(key)


@pytest.mark.parametrize("key, groups", [
    ("conv2d:N=2,C=3,H=7,W=6,K=4,R=3,S=2,stride=2x1,pad=1x0x2x1,dilation=1x2", 1),
    ("depthwise_conv2d:N=1,C=3,H=6,W=7,R=3,S=3,stride=2,pad=1,multiplier=2", 3),
    ("group_conv2d:N=2,C=8,H=7,W=6,K=6,R=3,S=2,stride=2x1,pad=1x0x2x1,dilation=1x2,groups=2",
     2),
    ("group_conv2d:N=1,C=12,H=5,W=9,K=8,R=1,S=3,pad=0x1x0x1,groups=4", 4),
    ("group_conv2d:N=1,C=16,H=1,W=11,K=24,R=1,S=3,stride=2,groups=8", 8),
])
def test_conv_references_match_a_direct_loop(key, groups):
    w = parse_workload(key)
    inputs = w.make_inputs(3)
    expected = naive_conv(inputs["data"], inputs["weight"], w.stride, w.pad, w.dilation, groups)
    np.testing.assert_allclose(w.reference(inputs), expected, rtol=1e-5, atol=1e-5)


def test_flops_and_shapes():
    d = parse_workload("dense:M=1,N=1000,K=512")
    assert d.flops() == 2 * 1000 * 512 and d.output_shape() == (1, 1000)
    b = parse_workload("batch_matmul:B=12,M=128,N=128,K=64")
    assert b.flops() == 2 * 12 * 128 * 128 * 64
    c = parse_workload("conv2d:N=1,C=3,H=224,W=224,K=64,R=7,S=7,stride=2,pad=3")
    assert c.output_shape() == (1, 64, 112, 112)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["N", "C", "H", "W", "K", "R", "S", "stride", "pad",
                                        "dilation", "Z"]),
                       st.integers(-3, 40), min_size=0, max_size=11))
def test_parsing_never_crashes(values):
    key = "conv2d:" + ",".join(f"{k}={v}" for k, v in values.items())
    try:
        w = parse_workload(key)
    except InvalidWorkloadError:
        return
    assert parse_workload(w.key) == w
    assert w.flops() > 0


def test_make_workload_accepts_lists():
    w = make_workload("conv2d", N=1, C=1, H=4, W=4, K=1, R=3, S=3, pad=[1, 1])
    assert w.pad == (1, 1, 1, 1)
