"""BlockedPool2d (pooling of NCHW[b]c activations) against numpy, with the plain pool's cases:
borders, strides, dilation, ceil mode, count_include_pad, windows over 64 taps, 1-2 threads,
channel counts that leave the last block padded."""

import json

import numpy as np
import pytest

from schedule_templates.ops.base import GeneratedOpError, op_from_json
from schedule_templates.ops.pool import Pool2d
from schedule_templates.ops.pool_blocked import BlockedPool2d
from schedule_templates.ops.run import compile_op
from schedule_templates.workloads.conv_nchwc import from_blocked, to_blocked
from tests.schedule_templates.ops.test_generated_pool import CASES


@pytest.mark.parametrize("shape, kernel, stride, pads, dilation", CASES)
@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("ceil_mode", [False, True])
def test_blocked_pool(check_op, shape, kernel, stride, pads, dilation, mode, ceil_mode):
    for include_pad in ([False, True] if mode == "avg" else [False]):
        for block in (16, 8):
            op = BlockedPool2d(shape, mode, kernel, stride, pads, dilation, ceil_mode,
                               include_pad, block)
            check_op(op, exact=mode == "max")


@pytest.mark.parametrize("mode", ["max", "avg"])
def test_real_lanes_equal_the_plain_pool(mode):
    # 20 channels in blocks of 16: the real lanes of the blocked result are the plain pool's
    shape = (1, 20, 13, 11)
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    plain = Pool2d(shape, mode, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), True, False)
    blocked = BlockedPool2d(shape, mode, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), True, False, 16)
    compiled = compile_op(blocked)
    try:
        got = compiled({"x": to_blocked(x, 16)}, threads=2)
    finally:
        compiled.close()
    want = plain.reference({"x": x})
    np.testing.assert_allclose(from_blocked(got, 20), want, rtol=1e-6, atol=1e-6)
    assert got.shape == (1, 2, 7, 6, 16)


def test_blocked_pool_round_trips_and_refuses_bad_attributes():
    op = BlockedPool2d((1, 20, 9, 9), "max", (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), True,
                       False, 16)
    assert op_from_json(json.loads(json.dumps(op.to_json()))) == op
    assert op.input_shapes() == {"x": (1, 2, 9, 9, 16)}
    with pytest.raises(GeneratedOpError):
        BlockedPool2d((1, 4, 9, 9), "max", (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), False,
                      False, 32)
    with pytest.raises(GeneratedOpError):
        BlockedPool2d((1, 4, 9, 9), "min", (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), False,
                      False, 16)
