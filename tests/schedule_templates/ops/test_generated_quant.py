"""QuantizedBinary (add, mul), Quantize and Dequantize against numpy: the same bytes
exactly, on odd sizes, every 8-bit type mix, with and without the fused Relu, on 1 and 2
threads."""

import json

import numpy as np
import pytest

from schedule_templates.ops.base import GeneratedOpError, op_from_json
from schedule_templates.ops.quant import (
    RANGES,
    Dequantize,
    Quantize,
    QuantizedBinary,
    QuantizedTable,
)
from schedule_templates.ops.run import compile_op


def _equal_on_1_and_2_threads(op, inputs, want):
    compiled = compile_op(op)
    try:
        for threads in (1, 2):
            np.testing.assert_array_equal(compiled(inputs, threads=threads), want)
    finally:
        compiled.close()


def _operand(rng: np.random.Generator, dtype: str, size: int) -> np.ndarray:
    lo, hi = RANGES[dtype]
    return rng.integers(lo, hi + 1, size).astype(dtype)


@pytest.mark.parametrize("size", [1, 15, 17, 1024, 3001, 200_704])
@pytest.mark.parametrize("a_dtype,b_dtype,out_dtype", [
    ("uint8", "uint8", "uint8"), ("int8", "uint8", "int8"), ("uint8", "int8", "uint8")])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("operation", ["add", "mul"])
def test_quantized_binary_equals_numpy(size, a_dtype, b_dtype, out_dtype, relu, operation):
    op = QuantizedBinary(size, a_dtype, 0.0371, 7 if a_dtype == "uint8" else -3,
                         b_dtype, 0.0213, 130 if b_dtype == "uint8" else 5,
                         out_dtype, 0.05, 12 if out_dtype == "uint8" else -1, relu,
                         operation=operation)
    rng = np.random.default_rng(size)
    inputs = {"a": _operand(rng, a_dtype, size), "b": _operand(rng, b_dtype, size)}
    want = op.reference(inputs)
    assert want.dtype == np.dtype(out_dtype)
    _equal_on_1_and_2_threads(op, inputs, want)


def test_quantized_add_rounds_like_numpy_not_like_an_fma():
    """175 and 24 at these parameters sum to 3.9749997 in two fp32 roundings (output 91) and
    to 3.975 in one (a fused multiply-add: 79.5, rounded to 80, output 92)."""
    op = QuantizedBinary(16, "uint8", 0.0371, 7, "uint8", 0.0213, 130, "uint8", 0.05, 12, True)
    inputs = {"a": np.full(16, 175, np.uint8), "b": np.full(16, 24, np.uint8)}
    compiled = compile_op(op)
    try:
        assert compiled(inputs)[0] == op.reference(inputs)[0] == 91
    finally:
        compiled.close()


def _onnxruntime_qlinear_add(a, b, a_q, b_q, y_q):
    """onnxruntime's com.microsoft QLinearAdd on a and b (one shape), ``*_q`` (scale, zp)."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    types = {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int8): TensorProto.INT8}
    out_type = np.uint8 if y_q[1] >= 0 and a.dtype == np.uint8 else np.int8
    inits = []
    for name, (scale, zero), dtype in (("a", a_q, a.dtype), ("b", b_q, b.dtype),
                                       ("y", y_q, np.dtype(out_type))):
        inits.append(helper.make_tensor(f"{name}_s", TensorProto.FLOAT, [], [scale]))
        inits.append(helper.make_tensor(f"{name}_z", types[dtype], [], [zero]))
    node = helper.make_node("QLinearAdd", ["a", "a_s", "a_z", "b", "b_s", "b_z", "y_s", "y_z"],
                            ["y"], domain="com.microsoft")
    graph = helper.make_graph(
        [node], "qladd",
        [helper.make_tensor_value_info("a", types[a.dtype], list(a.shape)),
         helper.make_tensor_value_info("b", types[b.dtype], list(b.shape))],
        [helper.make_tensor_value_info("y", types[np.dtype(out_type)], list(a.shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"a": a, "b": b})[0]


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_quantized_add_is_onnxruntimes_own_qlinear_add(dtype):
    """A shortcut addition gives onnxruntime's fused QLinearAdd bytes (its x86 arithmetic:
    two FMAs on the raw values), generated kernel and numpy reference alike, on random
    operands and scales."""
    rng = np.random.default_rng(5)
    size = 4099
    for _ in range(40):
        scales = rng.uniform(0.01, 0.1, 3).astype(np.float32)
        lo, hi = RANGES[dtype]
        zeros = [int(z) for z in rng.integers(lo, hi + 1, 3)]
        op = QuantizedBinary(size, dtype, float(scales[0]), zeros[0], dtype, float(scales[1]),
                             zeros[1], dtype, float(scales[2]), zeros[2])
        inputs = {"a": _operand(rng, dtype, size), "b": _operand(rng, dtype, size)}
        want = _onnxruntime_qlinear_add(inputs["a"], inputs["b"], (scales[0], zeros[0]),
                                        (scales[1], zeros[1]), (scales[2], zeros[2]))
        np.testing.assert_array_equal(op.reference(inputs), want)
    _equal_on_1_and_2_threads(op, inputs, want)


def test_quantized_add_round_trips_through_json_and_refuses_bad_parameters():
    op = QuantizedBinary(40, "uint8", 0.5, 3, "int8", 0.25, 0, "uint8", 1.0, 0)
    assert op_from_json(json.loads(json.dumps(op.to_json()))) == op
    with pytest.raises(GeneratedOpError, match="zero_point"):
        QuantizedBinary(40, "uint8", 0.5, 300, "uint8", 0.25, 0, "uint8", 1.0, 0)
    with pytest.raises(GeneratedOpError, match="scale"):
        QuantizedBinary(40, "uint8", 0.0, 3, "uint8", 0.25, 0, "uint8", 1.0, 0)
    with pytest.raises(GeneratedOpError, match="uint8 or int8"):
        QuantizedBinary(40, "float32", 0.5, 3, "uint8", 0.25, 0, "uint8", 1.0, 0)


@pytest.mark.parametrize("size", [1, 31, 4096, 100_003])
@pytest.mark.parametrize("dtype,zero_point", [("uint8", 128), ("int8", -5), ("uint8", 0)])
def test_quantize_and_dequantize_equal_numpy(size, dtype, zero_point):
    """Ties (x.5 steps round to even), saturation at both ends, odd sizes."""
    rng = np.random.default_rng(size)
    scale = 0.0625  # a power of two: many exact .5 ties among the inputs below
    x = (rng.integers(-600, 600, size) * np.float32(scale / 2)).astype(np.float32)
    quantize = Quantize(size, scale, zero_point, dtype)
    q = quantize.reference({"x": x})
    assert q.dtype == np.dtype(dtype)
    if size > 1000:  # +-600 half steps reach past both ends of the range
        assert {int(q.min()), int(q.max())} == set(RANGES[dtype])
    dequantize = Dequantize(size, dtype, 0.037, zero_point)
    _equal_on_1_and_2_threads(quantize, {"x": x}, q)
    _equal_on_1_and_2_threads(dequantize, {"x": q}, dequantize.reference({"x": q}))


@pytest.mark.parametrize("side", ["a", "b"])
@pytest.mark.parametrize("size,period", [(128 * 768, 768), (6 * 37, 37), (64, 1)])
def test_quantized_add_broadcasts_a_vector_along_the_rows(side, size, period):
    """A bias vector added to every row (BERT's dense layers leave one per layer in QDQ)."""
    op = QuantizedBinary(size, "uint8", 0.0013, 113, "uint8", 0.0187, 122, "uint8", 0.019, 122,
                      False, side, period)
    rng = np.random.default_rng(period)
    inputs = {name: _operand(rng, "uint8", shape[0]) for name, shape in op.input_shapes().items()}
    assert inputs[side].size == period
    want = op.reference(inputs)
    _equal_on_1_and_2_threads(op, inputs, want)
    with pytest.raises(GeneratedOpError, match="period"):
        QuantizedBinary(size + 1, "uint8", 0.1, 0, "uint8", 0.1, 0, "uint8", 0.1, 0, False, side,
                     period if period > 1 else 2)


@pytest.mark.parametrize("size", [1, 255, 4097, 200_003])
@pytest.mark.parametrize("in_dtype,out_dtype", [("uint8", "uint8"), ("int8", "uint8"),
                                                ("uint8", "int8")])
def test_quantized_table_looks_up_every_value(size, in_dtype, out_dtype):
    op = QuantizedTable(size, in_dtype, out_dtype)
    rng = np.random.default_rng(size)
    lo, hi = RANGES[out_dtype]
    inputs = {"x": _operand(rng, in_dtype, size),
              "table": rng.integers(lo, hi + 1, 256).astype(np.int32)}
    want = op.reference(inputs)
    low = RANGES[in_dtype][0]
    assert want.dtype == np.dtype(out_dtype)
    assert (want == inputs["table"][inputs["x"].astype(np.int64) - low]).all()
    _equal_on_1_and_2_threads(op, inputs, want)
