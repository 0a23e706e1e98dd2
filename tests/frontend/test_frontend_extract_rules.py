"""Mapping rules of ``extract_tasks`` on small hand-built graphs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper  # noqa: E402

from schedule_templates.workloads import (  # noqa: E402
    Conv2d,
    DepthwiseConv2d,
    GroupConv2d,
    parse_workload,
)
from tuner_service.compiler.frontend.errors import ModelError  # noqa: E402
from tuner_service.compiler.frontend.extract import ExtractionResult, extract_tasks  # noqa: E402

RNG = np.random.default_rng(7)


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _conv_model(tiny_model: Any, x_shape: tuple[int, ...], w_shape: tuple[int, ...], **attrs: Any):
    node = helper.make_node("Conv", ["x", "w"], ["y"], "conv", **attrs)
    return tiny_model([node], {"x": x_shape}, {"y": None}, {"w": _rand(*w_shape)})


def _only_task(result: ExtractionResult) -> str:
    assert result.unsupported == []
    assert len(result.tasks) == 1
    return result.tasks[0].workload.key


def _only_reason(result: ExtractionResult) -> str:
    assert result.tasks == []
    assert len(result.unsupported) == 1
    return result.unsupported[0].reason


CONV_CASES = [
    # (input shape, weight shape, attributes, expected key)
    (
        (1, 4, 9, 9),
        (8, 4, 3, 3),
        {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
        "conv2d:N=1,C=4,H=9,W=9,K=8,R=3,S=3,stride=2,pad=1",
    ),
    (
        (1, 4, 8, 8),
        (8, 4, 4, 4),
        {"auto_pad": "SAME_UPPER"},
        "conv2d:N=1,C=4,H=8,W=8,K=8,R=4,S=4,pad=1x1x2x2",
    ),
    (
        (1, 4, 8, 8),
        (8, 4, 4, 4),
        {"auto_pad": "SAME_LOWER"},
        "conv2d:N=1,C=4,H=8,W=8,K=8,R=4,S=4,pad=2x2x1x1",
    ),
    (
        (1, 4, 8, 8),
        (8, 4, 3, 3),
        {"auto_pad": "VALID", "pads": None},
        "conv2d:N=1,C=4,H=8,W=8,K=8,R=3,S=3",
    ),
    (
        (2, 3, 10, 12),
        (5, 3, 3, 2),
        {"pads": [0, 1, 2, 1], "dilations": [2, 1], "strides": [1, 2]},
        "conv2d:N=2,C=3,H=10,W=12,K=5,R=3,S=2,stride=1x2,pad=0x1x2x1,dilation=2x1",
    ),
    (
        (1, 6, 7, 7),
        (12, 1, 3, 3),
        {"group": 6, "pads": [1, 1, 1, 1]},
        "depthwise_conv2d:N=1,C=6,H=7,W=7,R=3,S=3,pad=1,multiplier=2",
    ),
    # grouped: channels per group above 1, odd sizes, stride, padding, dilation
    (
        (1, 8, 7, 9),
        (12, 2, 3, 3),
        {"group": 4, "pads": [1, 1, 1, 1], "strides": [2, 2]},
        "group_conv2d:N=1,C=8,H=7,W=9,K=12,R=3,S=3,stride=2,pad=1,groups=4",
    ),
    (
        (2, 16, 9, 8),
        (8, 8, 3, 2),
        {"group": 2, "dilations": [2, 1], "pads": [0, 1, 2, 0]},
        "group_conv2d:N=2,C=16,H=9,W=8,K=8,R=3,S=2,pad=0x1x2x0,dilation=2x1,groups=2",
    ),
    (
        (1, 16, 5, 5),
        (16, 2, 3, 3),
        {"group": 8, "auto_pad": "SAME_UPPER", "strides": [2, 2]},
        "group_conv2d:N=1,C=16,H=5,W=5,K=16,R=3,S=3,stride=2,pad=1,groups=8",
    ),
    # 1-D: a 2-D convolution over a height of 1
    ((1, 4, 20), (8, 4, 3), {}, "conv2d:N=1,C=4,H=1,W=20,K=8,R=1,S=3"),
    (
        (2, 6, 17),
        (9, 2, 5),
        {"group": 3, "strides": [2], "pads": [2, 1], "dilations": [1]},
        "group_conv2d:N=2,C=6,H=1,W=17,K=9,R=1,S=5,stride=1x2,pad=0x2x0x1,groups=3",
    ),
    (
        (1, 6, 15),
        (6, 1, 3),
        {"group": 6, "auto_pad": "SAME_UPPER"},
        "depthwise_conv2d:N=1,C=6,H=1,W=15,R=1,S=3,pad=0x1x0x1",
    ),
    (
        (1, 4, 10),
        (4, 4, 3),
        {"auto_pad": "SAME_LOWER", "strides": [2], "dilations": [1]},
        "conv2d:N=1,C=4,H=1,W=10,K=4,R=1,S=3,stride=1x2,pad=0x1x0x0",
    ),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "key"), CONV_CASES)
def test_conv_attributes(tiny_model: Any, x_shape: Any, w_shape: Any, attrs: Any, key: str) -> None:
    attrs = {k: v for k, v in attrs.items() if v is not None}
    assert _only_task(extract_tasks(_conv_model(tiny_model, x_shape, w_shape, **attrs))) == key


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "key"), CONV_CASES)
def test_conv_workload_computes_what_onnxruntime_computes(
    tiny_model: Any, x_shape: Any, w_shape: Any, attrs: Any, key: str
) -> None:
    """The strongest check of padding and stride: same numbers as the runtime."""
    ort = pytest.importorskip("onnxruntime")
    attrs = {k: v for k, v in attrs.items() if v is not None}
    model = _conv_model(tiny_model, x_shape, w_shape, **attrs)
    weight = onnx.numpy_helper.to_array(model.graph.initializer[0])
    data = _rand(*x_shape)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": data})
    workload = parse_workload(key)
    assert isinstance(workload, Conv2d | DepthwiseConv2d | GroupConv2d)
    shapes = workload.input_shapes()  # a 1-D convolution's tensors gain a unit height
    got = workload.reference({"data": data.reshape(shapes["data"]),
                              "weight": weight.reshape(shapes["weight"])})
    np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs", "reason"),
    [
        ((1, 4, 6, 6, 6), (8, 4, 3, 3, 3), {}, "3-D convolution"),
        ((1, 4, 6, 6, 6, 6), (8, 4, 3, 3, 3, 3), {}, "4-D convolution"),
        ((1, 8, 6, 6), (8, 2, 3, 3), {"group": 2}, "2 input channels per group"),
        ((1, 8, 6, 6), (6, 3, 3, 3), {"group": 3}, "group=3 does not divide"),
    ],
)
def test_conv_without_template(
    tiny_model: Any, x_shape: Any, w_shape: Any, attrs: Any, reason: str
) -> None:
    assert reason in _only_reason(extract_tasks(_conv_model(tiny_model, x_shape, w_shape, **attrs)))


@pytest.mark.parametrize("group", [1, 2])
def test_conv_with_a_runtime_weight_is_not_a_task(tiny_model: Any, group: int) -> None:
    """Kernels pack constant weights once: a weight fed at run time stays with onnx's op."""
    node = helper.make_node("Conv", ["x", "w"], ["y"], "conv", group=group)
    model = tiny_model([node], {"x": (1, 4, 6, 6), "w": (8, 4 // group, 3, 3)}, {"y": None})
    assert "computed at run time" in _only_reason(extract_tasks(model))


def _gemm(tiny_model: Any, b_const: bool, **attrs: Any) -> Any:
    b_shape = (16, 8) if attrs.get("transB") else (8, 16)
    node = helper.make_node("Gemm", ["a", "b"], ["y"], "gemm", **attrs)
    inputs = {"a": (8, 4) if attrs.get("transA") else (4, 8)}
    weights = {"b": _rand(*b_shape)} if b_const else {}
    if not b_const:
        inputs["b"] = b_shape
    return tiny_model([node], inputs, {"y": None}, weights)


@pytest.mark.parametrize(
    ("b_const", "attrs", "expected"),
    [
        (True, {"transB": 1}, "dense:M=4,N=16,K=8"),
        (True, {}, "dense:M=4,N=16,K=8"),  # weight transposed when packed
        (True, {"alpha": 0.5, "beta": 2.0}, "dense:M=4,N=16,K=8"),  # alpha folds into weight
        (False, {}, "batch_matmul:B=1,M=4,N=16,K=8"),
        (True, {"transA": 1}, "transA=1"),
        (False, {"transB": 1}, "transB=1"),
        (False, {"alpha": 2.0}, "alpha"),
    ],
)
def test_gemm(tiny_model: Any, b_const: bool, attrs: dict[str, Any], expected: str) -> None:
    result = extract_tasks(_gemm(tiny_model, b_const, **attrs))
    if ":" in expected:
        assert _only_task(result) == expected
    else:
        assert expected in _only_reason(result)


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "b_const", "expected"),
    [
        ((4, 8), (8, 16), True, "dense:M=4,N=16,K=8"),
        ((2, 3, 4, 8), (8, 16), True, "dense:M=24,N=16,K=8"),  # leading dims fold into M
        ((8,), (8, 16), True, "dense:M=1,N=16,K=8"),
        ((4, 8), (8, 16), False, "batch_matmul:B=1,M=4,N=16,K=8"),
        ((3, 4, 8), (3, 8, 16), False, "batch_matmul:B=3,M=4,N=16,K=8"),
        ((2, 3, 4, 8), (2, 3, 8, 16), False, "batch_matmul:B=6,M=4,N=16,K=8"),
        ((1, 3, 4, 8), (3, 8, 16), False, "batch_matmul:B=3,M=4,N=16,K=8"),
        ((3, 4, 8), (3, 8, 16), True, "batch_matmul:B=3,M=4,N=16,K=8"),
        ((3, 4, 8), (8, 16), False, "batch_matmul:B=1,M=12,N=16,K=8"),
        ((4, 8), (3, 8, 16), False, "broadcast"),
        ((3, 1, 4, 8), (1, 2, 8, 16), False, "broadcast"),
    ],
)
def test_matmul(tiny_model: Any, a_shape: Any, b_shape: Any, b_const: bool, expected: str) -> None:
    node = helper.make_node("MatMul", ["a", "b"], ["y"], "mm")
    inputs = {"a": a_shape} if b_const else {"a": a_shape, "b": b_shape}
    weights = {"b": _rand(*b_shape)} if b_const else {}
    result = extract_tasks(tiny_model([node], inputs, {"y": None}, weights))
    if ":" in expected:
        assert _only_task(result) == expected
    else:
        assert expected in _only_reason(result)


def test_weight_computed_from_constants_is_constant(tiny_model: Any) -> None:
    """An export without constant folding: MatMul(x, Transpose(W)) is still dense."""
    nodes = [
        helper.make_node("Transpose", ["w"], ["wt"], "t", perm=[1, 0]),
        helper.make_node("MatMul", ["x", "wt"], ["y"], "mm"),
    ]
    model = tiny_model(nodes, {"x": (4, 8)}, {"y": None}, {"w": _rand(16, 8)})
    assert _only_task(extract_tasks(model)) == "dense:M=4,N=16,K=8"


def test_identical_workloads_merge_in_graph_order(tiny_model: Any) -> None:
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], "first"),
        helper.make_node("MatMul", ["h", "w2"], ["h2"]),  # unnamed: gets a positional name
        helper.make_node("MatMul", ["h2", "w3"], ["y"], "third"),
    ]
    weights = {"w1": _rand(8, 8), "w2": _rand(8, 8), "w3": _rand(8, 4)}
    result = extract_tasks(tiny_model(nodes, {"x": (2, 8)}, {"y": None}, weights))
    assert [(t.workload.key, t.weight, t.nodes) for t in result.tasks] == [
        ("dense:M=2,N=8,K=8", 2, ("first", "MatMul_1")),
        ("dense:M=2,N=4,K=8", 1, ("third",)),
    ]
    assert result.total_flops() == 2 * (2 * 2 * 8 * 8) + 2 * 2 * 4 * 8


def test_dynamic_dimension_is_unsupported(tiny_model: Any) -> None:
    node = helper.make_node("MatMul", ["x", "w"], ["y"], "mm")
    model = tiny_model([node], {"x": ("batch", 8)}, {"y": None}, {"w": _rand(8, 4)})
    reason = _only_reason(extract_tasks(model))
    assert "dynamic dimension 'batch'" in reason


def test_non_float32_is_unsupported(tiny_model: Any) -> None:
    node = helper.make_node("MatMul", ["x", "w"], ["y"], "mm")
    weights = {"w": _rand(8, 4).astype(np.float16)}
    model = tiny_model([node], {"x": (2, 8)}, {"y": None}, weights, elem_type=10)
    assert "FLOAT16" in _only_reason(extract_tasks(model))


def test_conv_transpose_is_reported(tiny_model: Any) -> None:
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], "up")
    model = tiny_model([node], {"x": (1, 4, 5, 5)}, {"y": None}, {"w": _rand(4, 2, 3, 3)})
    result = extract_tasks(model)
    assert result.tasks == []
    assert [(u.op, u.node) for u in result.unsupported] == [("ConvTranspose", "up")]


def test_cheap_ops_are_neither_tasks_nor_unsupported(tiny_model: Any) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Softmax", ["r"], ["y"])]
    result = extract_tasks(tiny_model(nodes, {"x": (2, 8)}, {"y": None}))
    assert result == ExtractionResult(tasks=[], unsupported=[])


def test_matmul_inside_if_branch_is_reported(tiny_model: Any) -> None:
    branch = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["z"], "inner_mm")],
        "then",
        [],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [2, 4])],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["z2"])],
        "else",
        [],
        [helper.make_tensor_value_info("z2", onnx.TensorProto.FLOAT, [2, 4])],
    )
    node = helper.make_node("If", ["c"], ["y"], "branch", then_branch=branch, else_branch=other)
    model = tiny_model([node], {"c": (), "x": (2, 4)}, {"y": None}, {"w": _rand(4, 4)})
    model.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.BOOL
    result = extract_tasks(model)
    assert [(u.op, u.node) for u in result.unsupported] == [("MatMul", "inner_mm")]
    assert "If" in result.unsupported[0].reason


def test_absurd_layer_next_to_a_good_one_is_unsupported(tiny_model: Any) -> None:
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["y"], "huge"),
        helper.make_node("MatMul", ["v", "m"], ["z"], "fine"),
    ]
    weights = {"w": _rand(1, 1, 1, 1), "m": _rand(4, 4)}
    inputs = {"x": (1, 1, 40000, 40000), "v": (2, 4)}  # 1.6e9 elements: more than any layer
    result = extract_tasks(tiny_model(nodes, inputs, {"y": None, "z": None}, weights))
    assert [t.workload.key for t in result.tasks] == ["dense:M=2,N=4,K=4"]
    assert [u.node for u in result.unsupported] == ["huge"]
    assert "exceeds" in result.unsupported[0].reason


def test_model_made_only_of_absurd_layers_is_refused(tiny_model: Any) -> None:
    # 2^31 rows: far beyond MAX_TENSOR_ELEMENTS, though every single number is in range.
    node = helper.make_node("MatMul", ["x", "w"], ["y"], "mm")
    model = tiny_model([node], {"x": (1 << 16, 1 << 15, 2)}, {"y": None}, {"w": _rand(2, 2)})
    with pytest.raises(ModelError, match="impossible dimensions"):
        extract_tasks(model)


def test_input_proto_is_not_modified(tiny_model: Any) -> None:
    node = helper.make_node("MatMul", ["x", "w"], ["y"], "mm")
    model = tiny_model([node], {"x": (2, 8)}, {"y": None}, {"w": _rand(8, 4)})
    before = model.SerializeToString()
    extract_tasks(model)
    assert model.SerializeToString() == before


def test_custom_domain_ops_are_reported_and_their_outputs_unknown(tiny_model: Any) -> None:
    nodes = [
        helper.make_node("FusedConv", ["x", "w"], ["c"], "fused", domain="com.microsoft"),
        helper.make_node("Conv", ["c", "w2"], ["y"], "after"),
    ]
    weights = {"w": _rand(4, 3, 3, 3), "w2": _rand(4, 4, 3, 3)}
    model = tiny_model(nodes, {"x": (1, 3, 8, 8)}, {"y": (1, 4, 4, 4)}, weights)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    result = extract_tasks(model)
    assert result.tasks == []
    assert [(u.op, u.node) for u in result.unsupported] == [
        ("FusedConv", "fused"),
        ("Conv", "after"),
    ]
    assert "com.microsoft" in result.unsupported[0].reason
    assert "could not be inferred" in result.unsupported[1].reason
