"""Concat, slice and transpose: exact copies of numpy's results, 1 and 2 threads."""

import json
import math

import numpy as np
import pytest

from schedule_templates.ops.base import GeneratedOpError, op_from_json
from schedule_templates.ops.loops import Axis, collapse, row_major
from schedule_templates.ops.movement import TILE, Concat, Slice, Transpose, transpose_tiles
from schedule_templates.ops.run import compile_op


@pytest.mark.parametrize("outer, widths", [
    (1, (7,)), (5, (3, 13, 1)), (1, (64 * 56 * 56, 64 * 56 * 56)),  # channel concat, N = 1
    (37, (17, 33)), (2, (15, 16, 17)), (300, (70, 70, 3)), (1, (5000, 2999)),
])
def test_concat(check_op, outer, widths):
    check_op(Concat(outer, widths), exact=True)


@pytest.mark.parametrize("shape, starts, steps, out", [
    ((1, 7, 5, 3), (0, 2, 1, 0), (1, 1, 1, 1), (1, 4, 3, 3)),
    ((1, 7, 5, 3), (0, 0, 0, 1), (1, 2, 2, 1), (1, 4, 3, 2)),
    ((4, 13, 33), (1, 0, 3), (2, 3, 2), (2, 5, 15)),
    ((2, 64, 56, 56), (0, 32, 0, 0), (1, 1, 1, 1), (2, 32, 56, 56)),  # channel split
    ((1, 3, 224, 224), (0, 0, 1, 1), (1, 1, 2, 2), (1, 3, 112, 112)),  # space-to-depth part
    ((100000,), (17,), (1,), (99983,)),
    ((9,), (8,), (1,), (1,)),
])
def test_slice(check_op, shape, starts, steps, out):
    check_op(Slice(shape, starts, steps, out), exact=True)


@pytest.mark.parametrize("shape, perm", [
    ((1, 7, 5, 3), (0, 2, 3, 1)),            # NCHW -> NHWC
    ((1, 5, 3, 7), (0, 3, 1, 2)),            # NHWC -> NCHW
    ((2, 13, 17), (1, 0, 2)),                # the inner axis stays: vector copies
    ((197, 12, 64), (1, 0, 2)),              # attention heads, threaded
    ((12, 197, 64), (0, 2, 1)),              # K^T
    ((300, 301), (1, 0)),
    ((3, 1, 4, 1), (3, 2, 1, 0)),            # size-1 axes
    ((2, 3, 4, 5, 6), (4, 0, 3, 1, 2)),
    ((1, 24, 28, 28), (0, 2, 3, 1)),
    ((1, 32, 32, 24), (0, 3, 1, 2)),         # NHWC -> NCHW in tiles of 16 pixels
    ((2, 48, 20), (0, 2, 1)),                # tiles, the batch axis outermost
    ((5, 64, 3, 7), (2, 0, 3, 1)),           # tiles, two other axes
])
def test_transpose(check_op, shape, perm):
    check_op(Transpose(shape, perm), exact=True)


@pytest.mark.parametrize("shape, perm, tiled", [
    ((1, 56, 56, 96), (0, 3, 1, 2), True),   # ConvNeXt's NHWC -> NCHW
    ((1, 32, 32, 24), (0, 3, 1, 2), True),
    ((2, 48, 20), (0, 2, 1), True),
    ((5, 64, 3, 7), (2, 0, 3, 1), True),
    ((1, 14, 14, 384), (0, 3, 1, 2), False),  # 196 pixels: not whole tiles, rows as before
    ((197, 12, 64), (1, 0, 2), False),       # the inner axis stays contiguous
])
def test_transposes_of_the_contiguous_axis_walk_tiles(shape, perm, tiled):
    src, dst = row_major(shape), row_major(tuple(shape[p] for p in perm))
    axes = [Axis(shape[p], (src[p], d)) for p, d in zip(perm, dst, strict=True)]
    tiles = transpose_tiles(collapse(axes))
    assert (tiles is not None) == tiled
    if tiles is not None:
        assert tiles[-1].extent == TILE and tiles[-2].strides[0] == 1
        assert math.prod(a.extent for a in tiles) == math.prod(shape)


def test_contiguous_copies_are_vectorized():
    compiled = compile_op(Concat(64, (1024, 512)))
    try:
        assert "<16 x float>" in compiled.llvm_ir
    finally:
        compiled.close()


@pytest.mark.parametrize("op", [Concat(3, (1, 2)), Slice((4, 5), (1, 0), (2, 1), (2, 5)),
                                Transpose((2, 3, 4), (2, 0, 1))])
def test_json_round_trip(op):
    assert op_from_json(json.loads(json.dumps(op.to_json()))) == op


@pytest.mark.parametrize("data", [
    {"kind": "concat", "outer": 0, "widths": [1, 2]},
    {"kind": "concat", "outer": 2, "widths": []},
    {"kind": "concat", "outer": 2, "widths": [1, -2]},
    {"kind": "slice", "shape": [4, 5], "starts": [1], "steps": [1, 1], "out": [1, 1]},
    {"kind": "slice", "shape": [4, 5], "starts": [1, 0], "steps": [0, 1], "out": [1, 1]},
    {"kind": "slice", "shape": [4, 5], "starts": [1, 0], "steps": [2, 1], "out": [3, 5]},
    {"kind": "slice", "shape": [4, 5], "starts": [-1, 0], "steps": [1, 1], "out": [1, 5]},
    {"kind": "transpose", "shape": [2, 3], "perm": [0, 0]},
    {"kind": "transpose", "shape": [2, 3], "perm": [1, 0, 2]},
    {"kind": "transpose", "shape": [2, 3], "perm": "10"},
])
def test_malformed_is_refused(data):
    with pytest.raises(GeneratedOpError):
        op_from_json(data)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("shape, perm", [
    ((1, 13, 12, 64), (0, 2, 1, 3)),         # BERT's heads: (B, S, H, D) -> (B, H, S, D)
    ((1, 13, 12, 64), (0, 2, 3, 1)),         # K^T: the inner axis moves, gathered
    ((1, 12, 13, 64), (0, 2, 1, 3)),         # heads back
    ((3, 17, 5), (2, 0, 1)),
    ((300, 301), (1, 0)),
    ((7,), (0,)),
    ((24, 64), (1, 0)),                      # tiles of 16 bytes
])
def test_byte_transpose_is_numpy_exactly(dtype, shape, perm):
    """8-bit activations (a quantized model's) move as bytes: numpy's transpose exactly."""
    op = Transpose(shape, perm, dtype)
    info = np.iinfo(dtype)
    x = np.random.default_rng(len(shape)).integers(info.min, info.max + 1, shape).astype(dtype)
    want = np.ascontiguousarray(x.transpose(perm))
    np.testing.assert_array_equal(op.reference({"x": x}), want)
    compiled = compile_op(op)
    try:
        assert compiled.kernel.output.dtype == dtype
        for threads in (1, 2):
            got = compiled({"x": x}, threads=threads)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)
    finally:
        compiled.close()


def test_an_fp32_transpose_keeps_its_key_and_a_byte_one_says_its_type():
    assert "dtype" not in Transpose((2, 3), (1, 0)).to_json()  # as before the field existed
    op = Transpose((2, 3), (1, 0), "uint8")
    assert op.to_json()["dtype"] == "uint8"
    assert op_from_json(json.loads(json.dumps(op.to_json()))) == op
    assert op.key != Transpose((2, 3), (1, 0)).key
    with pytest.raises(GeneratedOpError, match="dtype"):
        Transpose((2, 3), (1, 0), "float64")
