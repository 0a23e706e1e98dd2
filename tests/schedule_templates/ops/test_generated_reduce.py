"""Reductions, softmax and layer norm against numpy on odd sizes, 1 and 2 threads."""

import json

import pytest

from schedule_templates.ops.base import GeneratedOpError, op_from_json
from schedule_templates.ops.reduce import LayerNorm, LogSoftmax, Reduce, Softmax

# lengths around the 16- and 64-lane accumulator widths and their short-vector tails (79: 64 +
# 15, 81: 64 + 16 + 1, 197: a ViT row), plus large enough ones to thread
ROW_LENGTHS = [1, 7, 15, 16, 17, 63, 64, 65, 79, 81, 100, 197, 1000]


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("outer, reduced, inner", [
    (1, 7, 1), (13, 5, 3), (3, 100, 1), (70, 1000, 1), (2, 300, 17), (1, 1, 1), (5, 64, 1),
    (5, 65, 1), (4, 16, 1), (4, 95, 1), (128, 49, 1), (40, 3, 1000), (1, 37, 21),
    (1, 96, 56 * 56 + 5), (2, 7, 4099),  # a channel mean over NCHW: long runs cut in blocks
])
def test_reduce(check_op, mode, outer, reduced, inner):
    check_op(Reduce(mode, outer, reduced, inner))


@pytest.mark.parametrize("cols", ROW_LENGTHS)
@pytest.mark.parametrize("cls", [Softmax, LogSoftmax])
def test_softmax(check_op, cls, cols):
    check_op(cls(5, cols))


def test_softmax_threaded_rows(check_op):
    check_op(Softmax(96, 385))  # enough rows x cols to run on two threads


@pytest.mark.parametrize("cols", ROW_LENGTHS)
@pytest.mark.parametrize("scale, bias", [(True, True), (True, False), (False, True),
                                         (False, False)])
def test_layernorm(check_op, cols, scale, bias):
    check_op(LayerNorm(3, cols, 1e-5, scale, bias))


def test_layernorm_threaded_rows(check_op):
    check_op(LayerNorm(197, 768, 1e-6, True, True))


@pytest.mark.parametrize("op", [Reduce("mean", 2, 3, 4), Softmax(3, 9), LogSoftmax(3, 9),
                                LayerNorm(4, 10, 1e-5, True, False)])
def test_json_round_trip(op):
    again = op_from_json(json.loads(json.dumps(op.to_json())))
    assert again == op and type(again) is type(op)


@pytest.mark.parametrize("data", [
    {"kind": "reduce", "mode": "prod", "outer": 1, "reduced": 2, "inner": 1},
    {"kind": "reduce", "mode": "sum", "outer": 0, "reduced": 2, "inner": 1},
    {"kind": "reduce", "mode": "sum", "outer": 1, "reduced": 2},
    {"kind": "reduce", "mode": "sum", "outer": 1, "reduced": "2", "inner": 1},
    {"kind": "softmax", "rows": 2, "cols": -1},
    {"kind": "softmax", "rows": 2, "cols": 3, "axis": 1},
    {"kind": "layernorm", "rows": 2, "cols": 3, "eps": -1.0, "scale": True, "bias": True},
    {"kind": "layernorm", "rows": 2, "cols": 3, "eps": 1e-5, "scale": 1, "bias": True},
    {"kind": "batchnorm", "rows": 2},
])
def test_malformed_is_refused(data):
    with pytest.raises(GeneratedOpError):
        op_from_json(data)
