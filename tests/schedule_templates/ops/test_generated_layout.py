"""NCHW <-> NCHW[b]c transforms: exact copies, padded channels zero, round trips."""

import ctypes
import json

import numpy as np
import pytest

from schedule_templates.ops.base import GeneratedOpError, op_from_json
from schedule_templates.ops.layout import FromBlocked, ToBlocked
from schedule_templates.ops.run import compile_op

SHAPES = [
    ((1, 11, 9, 10), 8),      # C not a multiple of the block
    ((2, 16, 7, 7), 8),       # whole blocks only
    ((1, 3, 224, 224), 8),    # a model input: one partial block, threaded
    ((1, 5, 13), 4),          # 1-D spatial
    ((1, 20, 3, 3), 16),
    ((2, 5, 1, 1), 16),       # fewer channels than one block
    ((1, 96, 56, 56), 8),
]


@pytest.mark.parametrize("shape, block", SHAPES)
def test_to_blocked(check_op, shape, block):
    check_op(ToBlocked(shape, block), exact=True)


@pytest.mark.parametrize("shape, block", SHAPES)
def test_from_blocked(check_op, shape, block):
    check_op(FromBlocked(shape, block), exact=True)


@pytest.mark.parametrize("shape, block", SHAPES)
def test_round_trip(shape, block):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    to, back = compile_op(ToBlocked(shape, block)), compile_op(FromBlocked(shape, block))
    try:
        blocked = to({"x": x}, threads=2)
        assert blocked.shape == (shape[0], -(-shape[1] // block), *shape[2:], block)
        np.testing.assert_array_equal(back({"x": blocked}, threads=2), x)
    finally:
        to.close()
        back.close()


def test_padded_lanes_are_written_as_zeros():
    """The kernel itself zeroes the padding (the output buffer may hold anything)."""
    op = ToBlocked((1, 11, 4, 5), 8)
    compiled = compile_op(op)
    try:
        x = np.random.default_rng(2).standard_normal(op.shape).astype(np.float32)
        out = np.full(op.output_shape(), np.nan, dtype=np.float32)
        compiled._compiled.function(ctypes.c_void_p(x.ctypes.data),
                                    ctypes.c_void_p(out.ctypes.data), ctypes.c_int64(1))
        assert not np.isnan(out).any()
        np.testing.assert_array_equal(out[:, 1, :, :, 3:], 0.0)
    finally:
        compiled.close()


def test_padded_lanes_of_a_blocked_input_are_dropped():
    op = FromBlocked((1, 6, 3, 3), 4)
    x = np.random.default_rng(3).standard_normal(op.input_shapes()["x"]).astype(np.float32)
    compiled = compile_op(op)
    try:
        got = compiled({"x": x}, threads=1)
        x[:, 1, :, :, 2:] = 1e30  # the padding: changes nothing
        np.testing.assert_array_equal(compiled({"x": x}, threads=1), got)
    finally:
        compiled.close()


def test_manifest_round_trip_and_bad_attributes():
    for op in (ToBlocked((1, 11, 9, 10), 8), FromBlocked((2, 3, 5), 16)):
        assert op_from_json(json.loads(json.dumps(op.to_json()))) == op
    with pytest.raises(GeneratedOpError, match="block"):
        ToBlocked((1, 8, 2, 2), 6)
    with pytest.raises(GeneratedOpError, match="channel axis"):
        FromBlocked((7,), 8)
