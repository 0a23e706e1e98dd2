"""Elementwise chains against numpy: every instruction, every kind of broadcast, 1 and 2 threads."""

import json

import numpy as np
import pytest

from schedule_templates.ops.base import GeneratedOpError, op_from_json
from schedule_templates.ops.elementwise import BINARY, UNARY, Elementwise
from schedule_templates.ops.run import compile_op

ODD = (1, 7, 5, 3)
POSITIVE_ONLY = {"log", "sqrt", "reciprocal"}


@pytest.mark.parametrize("op", UNARY)
def test_each_unary_instruction(check_op, op):
    check_op(Elementwise(ODD, (ODD,), ((op, "x0"),)), positive=op in POSITIVE_ONLY)


@pytest.mark.parametrize("op", [b for b in BINARY if b != "pow"])
def test_each_binary_instruction(check_op, op):
    check_op(Elementwise(ODD, (ODD, (5, 1)), ((op, "x0", "x1"),)))


@pytest.mark.parametrize("exponent", [2.0, 3.0, 0.5, -1.0, 1.7, 1.0])
def test_pow_by_literal(check_op, exponent):
    check_op(Elementwise((13, 21), ((13, 21),), (("pow", "x0", exponent),)), positive=True)


@pytest.mark.parametrize("instruction", [
    ("clip", "x0", -0.5, 0.25), ("clip", "x0", float("-inf"), 0.3),
    ("clip", "x0", 0.0, float("inf")), ("hardsigmoid", "x0", 0.2, 0.5),
    ("leakyrelu", "x0", 0.01), ("leakyrelu", "x0", -1.5),
])
def test_parametric_instructions(check_op, instruction):
    check_op(Elementwise(ODD, (ODD,), (instruction,)))


@pytest.mark.parametrize("shape, inputs", [
    (ODD, (ODD, ())),                                   # scalar
    ((2, 13, 9, 11), ((2, 13, 9, 11), (1, 13, 1, 1))),  # per channel
    ((2, 13, 9, 11), ((2, 13, 9, 11), (13, 1, 1))),     # per channel, shorter rank
    ((4, 9, 37), ((4, 9, 37), (37,))),                  # trailing
    ((6, 5, 33), ((6, 5, 33), (6, 1, 1))),              # leading
    ((6, 5, 33), ((6, 1, 33), (1, 5, 1))),              # outer-product style, both broadcast
    ((1, 1, 77), ((1, 1, 77), (1, 1, 1))),              # size-1 axes everywhere
    ((1,), ((1,), ())),                                 # one element
    ((), ((), ())),                                     # rank 0
    ((3, 50001), ((3, 50001), (3, 1))),                 # long rows: block-split threading
    ((40000,), ((40000,), (40000,))),                   # 1-D, threaded by blocks
    ((8, 64, 35, 35), ((8, 64, 35, 35), (1, 64, 1, 1))),  # enough outer work for threads
    ((300, 70), ((300, 70), (70,), ())),
])
def test_broadcast_kinds(check_op, shape, inputs):
    program = (("mul", "x0", "x1"), ("add", "t0", "x0"), ("max", "t1", -0.25))
    if len(inputs) == 3:
        program = (*program, ("sub", "t2", "x2"))
    check_op(Elementwise(shape, inputs, program))


def test_chain_with_shared_temporaries(check_op):
    # swish then a residual add; t0 and t2 are each used twice (kept in LOCAL temporaries)
    program = (("add", "x0", "x1"), ("sigmoid", "t0"), ("mul", "t0", "t1"),
               ("mul", "t2", "t2"), ("add", "t3", "t2"), ("gelu", "t4"), ("hardswish", "t5"))
    check_op(Elementwise((2, 19, 7, 7), ((2, 19, 7, 7), (1, 19, 1, 1)), program))


def test_literal_first_operand(check_op):
    check_op(Elementwise(ODD, (ODD,), (("sub", 1.0, "x0"), ("div", 2.0, "t0"))))


def test_large_add_is_vectorized():
    op = Elementwise((64, 4096), ((64, 4096), (64, 4096)), (("add", "x0", "x1"),))
    compiled = compile_op(op)
    try:
        assert "<16 x float>" in compiled.llvm_ir
        assert "GOMP_parallel" in compiled.llvm_ir
    finally:
        compiled.close()


def test_json_round_trip():
    op = Elementwise((2, 3, 4), ((2, 3, 4), (3, 1), ()),
                     (("add", "x0", "x1"), ("clip", "t0", float("-inf"), 6.0), ("mul", "t1", "x2")))
    again = op_from_json(json.loads(json.dumps(op.to_json())))
    assert again == op and again.key == op.key


@pytest.mark.parametrize("data", [
    {"kind": "elementwise", "shape": [2, 3], "inputs": [[2, 3]]},                  # no program
    {"kind": "elementwise", "shape": [2, 0], "inputs": [[2, 0]], "program": [["relu", "x0"]]},
    {"kind": "elementwise", "shape": [2, 3], "inputs": [[4]], "program": [["relu", "x0"]]},
    {"kind": "elementwise", "shape": [2, 3], "inputs": [[2, 3]], "program": [["sin", "x0"]]},
    {"kind": "elementwise", "shape": [2, 3], "inputs": [[2, 3]], "program": [["add", "x0"]]},
    {"kind": "elementwise", "shape": [2, 3], "inputs": [[2, 3]], "program": [["relu", "t0"]]},
    {"kind": "elementwise", "shape": [2, 3], "inputs": [[2, 3]], "program": [["relu", "x1"]]},
    {"kind": "elementwise", "shape": [2, 3], "inputs": [[2, 3]],
     "program": [["pow", "x0", "x0"]]},
    {"kind": "elementwise", "shape": [2, 3], "inputs": [[2, 3]],
     "program": [["clip", "x0", "x0", 1.0]]},
    {"kind": "elementwise", "shape": [2, 3], "inputs": [[2, 3]], "program": [["add", 1.0, 2.0]]},
    {"kind": "elementwise", "shape": "2x3", "inputs": [[2, 3]], "program": [["relu", "x0"]]},
    {"kind": "elementwise", "shape": [2, 3], "inputs": [], "program": [["relu", "x0"]]},
    {"kind": "elementwise", "shape": [2, 3], "inputs": [[2, 3]], "program": [],},
    {"kind": "elementwise", "shape": [2.5, 3], "inputs": [[2, 3]], "program": [["relu", "x0"]]},
])
def test_malformed_is_refused(data):
    with pytest.raises(GeneratedOpError):
        op_from_json(data)


def test_wrong_inputs_at_call_time():
    compiled = compile_op(Elementwise((2, 3), ((2, 3),), (("relu", "x0"),)))
    try:
        with pytest.raises(GeneratedOpError):
            compiled({"x0": np.zeros((3, 2), np.float32)})
        with pytest.raises(GeneratedOpError):
            compiled({"y": np.zeros((2, 3), np.float32)})
    finally:
        compiled.close()
