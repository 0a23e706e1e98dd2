"""Pool2d against numpy: borders, strides, dilation, ceil mode, count_include_pad, 1-2 threads."""

import json

import pytest

from schedule_templates.ops.base import GeneratedOpError, op_from_json
from schedule_templates.ops.pool import Pool2d
from schedule_templates.ops.run import compile_op

CASES = [  # shape, kernel, stride, pads (top, left, bottom, right), dilation
    ((1, 7, 5, 3), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((2, 13, 17, 19), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    ((1, 3, 33, 35), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1)),
    ((1, 5, 20, 21), (3, 2), (1, 2), (1, 0, 2, 1), (2, 1)),  # asymmetric pads, dilation
    ((2, 4, 9, 9), (7, 7), (1, 1), (3, 3, 3, 3), (1, 1)),
    ((1, 2, 30, 30), (9, 9), (1, 1), (4, 4, 4, 4), (1, 1)),  # > 64 taps: folded row by row
    ((2, 64, 56, 56), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),  # ResNet stem pool, threaded
    ((1, 6, 14, 14), (5, 5), (3, 3), (2, 2, 2, 2), (1, 1)),
    ((1, 1, 1, 1), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1)),
    ((3, 32, 40, 37), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),  # stride 1, threaded, SIMD rows
    ((1, 2, 2, 40), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),  # no interior rows at all
    ((1, 3, 8, 8), (4, 4), (4, 4), (2, 2, 2, 2), (1, 1)),  # no interior position
]


@pytest.mark.parametrize("shape, kernel, stride, pads, dilation", CASES)
@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("ceil_mode", [False, True])
def test_pool(check_op, shape, kernel, stride, pads, dilation, mode, ceil_mode):
    for include_pad in ([False, True] if mode == "avg" else [False]):
        op = Pool2d(shape, mode, kernel, stride, pads, dilation, ceil_mode, include_pad)
        check_op(op, exact=mode == "max")


def test_output_shapes_follow_onnx():
    assert Pool2d((1, 1, 112, 112), "max", (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False,
                  False).output_shape() == (1, 1, 56, 56)
    # ceil mode adds the partial window, but never one that starts in the tail padding
    assert Pool2d((1, 1, 6, 6), "max", (2, 2), (2, 2), (0, 0, 1, 1), (1, 1), True,
                  False).output_shape() == (1, 1, 3, 3)
    assert Pool2d((1, 1, 5, 5), "avg", (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), True,
                  False).output_shape() == (1, 1, 3, 3)


def test_stride_one_rows_are_vectorized():
    op = Pool2d((1, 8, 64, 64), "max", (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), False, False)
    compiled = compile_op(op)
    try:
        assert "<16 x float>" in compiled.llvm_ir
    finally:
        compiled.close()


def test_json_round_trip():
    op = Pool2d((1, 3, 8, 8), "avg", (3, 3), (2, 2), (1, 1, 0, 0), (1, 1), True, True)
    assert op_from_json(json.loads(json.dumps(op.to_json()))) == op


GOOD = {"kind": "pool2d", "shape": [1, 3, 8, 8], "mode": "max", "kernel": [3, 3],
        "stride": [1, 1], "pads": [1, 1, 1, 1], "dilation": [1, 1], "ceil_mode": False,
        "count_include_pad": False}


@pytest.mark.parametrize("change", [
    {"shape": [3, 8, 8]}, {"shape": [1, 3, 0, 8]}, {"mode": "min"}, {"kernel": [3]},
    {"kernel": [0, 3]}, {"stride": [1, 0]}, {"pads": [1, 1]}, {"pads": [-1, 0, 0, 0]},
    {"dilation": [1, 1, 1]}, {"ceil_mode": "no"}, {"kernel": [9, 9], "pads": [0, 0, 0, 0]},
    {"pads": [3, 3, 3, 3]},  # a window entirely in the padding
])
def test_malformed_is_refused(change):
    with pytest.raises(GeneratedOpError):
        op_from_json({**GOOD, **change})


@pytest.mark.parametrize("shape, kernel, stride, pads, dilation", CASES)
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("ceil_mode", [False, True])
def test_byte_max_pool_is_numpy_bytes(shape, kernel, stride, pads, dilation, dtype, ceil_mode):
    """Every window's largest byte, the full range of the type included (unsigned values
    above 127 compare as such), borders and padding never winning."""
    import numpy as np

    from schedule_templates.ops.pool import BytePool2d

    op = BytePool2d(shape, "max", kernel, stride, pads, dilation, ceil_mode, False, dtype)
    info = np.iinfo(dtype)
    x = np.random.default_rng(3).integers(info.min, info.max + 1, shape).astype(dtype)
    x.reshape(-1)[::7] = info.min  # windows of minimum values: padding must not win there
    expected = op.reference({"x": x})
    assert expected.dtype == np.dtype(dtype) and expected.shape == op.output_shape()
    compiled = compile_op(op)
    try:
        for threads in (1, 2):
            np.testing.assert_array_equal(compiled({"x": x}, threads=threads), expected)
    finally:
        compiled.close()


def test_strided_rows_load_their_span_whole():
    """Stride-2 windows over a model's activation (no slack past its end) read each row's
    span (31 bytes for 16 lanes) as two overlapping 16-byte loads plus a shuffle, not byte by
    byte (the stem pool of ResNet-50 int8 ran 4x slower gathered; one odd-sized <31 x i8>
    load was split by LLVM into byte inserts)."""
    from schedule_templates.ops.pool import BytePool2d

    op = BytePool2d((1, 4, 40, 40), "max", (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False, False,
                    "uint8")
    compiled = compile_op(op)
    try:
        assert "<16 x i8>" in compiled.llvm_ir and "shufflevector" in compiled.llvm_ir
        assert "<31 x i8>" not in compiled.llvm_ir
    finally:
        compiled.close()


def test_byte_pool_refuses_what_it_does_not_do():
    from schedule_templates.ops.pool import BytePool2d

    for mode, include_pad, dtype in (("avg", False, "uint8"), ("max", True, "uint8"),
                                     ("max", False, "float32")):
        with pytest.raises(GeneratedOpError):
            BytePool2d((1, 1, 4, 4), mode, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), False,
                       include_pad, dtype)
    op = BytePool2d((1, 3, 8, 8), "max", (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False, False,
                    "int8")
    assert op_from_json(json.loads(json.dumps(op.to_json()))) == op
