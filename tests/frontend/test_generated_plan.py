"""The generated-operator planner: each mapping (checked through the operator's numpy
``reference`` against onnxruntime's tensors), each refusal, and where elementwise chains fuse."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from fusion_support import ort_values  # noqa: E402
from onnx import helper  # noqa: E402

from schedule_templates.ops.base import op_kinds  # noqa: E402
from tuner_service.compiler.frontend.fusion import plan_layers  # noqa: E402
from tuner_service.compiler.frontend.generated import GeneratedLayer, plan_generated  # noqa: E402
from tuner_service.compiler.frontend.generated_elementwise import MAX_INSTRUCTIONS  # noqa: E402
from tuner_service.compiler.frontend.loading import load_model  # noqa: E402

X = {"x": (2, 8, 6, 5)}
TinyModel = Callable[..., Any]  # the ``tiny_model`` fixture


def plan(model: Any) -> list[GeneratedLayer]:
    proto = load_model(model)
    return plan_generated(proto, plan_layers(proto))


def needs(*kinds: str) -> None:
    missing = set(kinds) - set(op_kinds())
    if missing:
        pytest.skip(f"operator classes not implemented yet: {sorted(missing)}")


def check(model: Any, seed: int = 0, positive: bool = False) -> list[GeneratedLayer]:
    """Plan, then run every layer's ``reference`` on onnxruntime's values of its inputs and
    compare with onnxruntime's value of its output."""
    layers = plan(model)
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        data = rng.standard_normal(shape).astype(np.float32)
        feeds[value.name] = np.abs(data) + 0.5 if positive else data
    names = {t for layer in layers for t in [*layer.inputs.values(), layer.output]}
    values = ort_values(model, feeds, names)
    for layer in layers:
        shapes = layer.op.input_shapes()
        inputs = {n: (layer.constants[n] if n in layer.constants
                      else np.asarray(values[layer.inputs[n]], np.float32)).reshape(shapes[n])
                  for n in shapes}
        got = layer.op.reference(inputs)
        want = values[layer.output]
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-5,
                                   err_msg=f"{layer.op.kind} {layer.nodes}")
    return layers


def node(op: str, inputs: list[str], output: str, **attrs: Any) -> Any:
    return helper.make_node(op, inputs, [output], name=output, **attrs)


# --- elementwise ---------------------------------------------------------------------------

UNARY = ["Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Neg", "Abs", "Floor", "HardSwish",
         "Reciprocal"]


@pytest.mark.parametrize("op", UNARY)
def test_unary_nodes_map_to_one_instruction(op: str, tiny_model: TinyModel) -> None:
    needs("elementwise")
    (layer,) = check(tiny_model([node(op, ["x"], "y")], X, {"y": None}))
    assert layer.op.kind == "elementwise" and layer.inputs == {"x0": "x"}
    assert len(layer.op.program) == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("op", ["Log", "Sqrt"])
def test_unary_nodes_of_positive_inputs(op: str, tiny_model: TinyModel) -> None:
    needs("elementwise")
    (layer,) = check(tiny_model([node(op, ["x"], "y")], X, {"y": None}), positive=True)
    assert layer.op.kind == "elementwise"


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
def test_binary_nodes_broadcast_their_inputs(op: str, tiny_model: TinyModel) -> None:
    needs("elementwise")
    model = tiny_model([node(op, ["x", "b"], "y")], {"x": (2, 8, 6, 5), "b": (8, 1, 5)},
                       {"y": None})
    (layer,) = check(model)
    assert layer.op.inputs == ((2, 8, 6, 5), (8, 1, 5))  # type: ignore[attr-defined]


def test_parametric_nodes_and_scalar_literals(tiny_model: TinyModel) -> None:
    needs("elementwise")
    weights = {"lo": np.float32(-0.5), "hi": np.float32(0.7), "e": np.float32(2.0),
               "bias": np.linspace(-1, 1, 5, dtype=np.float32)}
    nodes = [node("Clip", ["x", "lo", "hi"], "c"), node("LeakyRelu", ["c"], "l", alpha=0.2),
             node("HardSigmoid", ["l"], "h", alpha=0.3, beta=0.4), node("Pow", ["h", "e"], "p"),
             node("Add", ["p", "bias"], "y")]
    (layer,) = check(tiny_model(nodes, X, {"y": None}, {k: np.asarray(v) for k, v in
                                                           weights.items()}))
    program = layer.op.program  # type: ignore[attr-defined]
    assert [i[0] for i in program] == ["clip", "leakyrelu", "hardsigmoid", "pow", "add"]
    assert program[0][2:] == (-0.5, pytest.approx(0.7)) and program[3][2] == 2.0
    assert layer.inputs == {"x0": "x", "x1": "bias"}  # the scalars became literals


def test_batch_norm_becomes_per_channel_constants(tiny_model: TinyModel) -> None:
    needs("elementwise")
    rng = np.random.default_rng(1)
    params = {n: rng.uniform(0.5, 1.5, 8).astype(np.float32) for n in "gbmv"}
    bn = helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"], name="bn",
                          epsilon=1e-3)
    (layer,) = check(tiny_model([bn], X, {"y": None}, params))
    assert sorted(layer.constants) == ["x1", "x2"] and layer.constants["x1"].shape == (8, 1, 1)


def test_gelu_opset20_both_forms(tiny_model: TinyModel) -> None:
    needs("elementwise")
    nodes = [node("Gelu", ["x"], "a"), node("Gelu", ["x"], "b", approximate="tanh"),
             node("Add", ["a", "b"], "y")]
    (layer,) = check(tiny_model(nodes, X, {"y": None}, opset=20))
    assert len(layer.nodes) == 3


def test_chains_fuse_through_single_reader_edges(tiny_model: TinyModel) -> None:
    """SiLU: the Sigmoid fuses into the Mul, ``x`` (two readers) stays an input; a tensor
    with two readers or that is a graph output ends a chain."""
    needs("elementwise")
    nodes = [node("Sigmoid", ["x"], "s"), node("Mul", ["x", "s"], "silu"),
             node("Relu", ["silu"], "r1"), node("Tanh", ["silu"], "r2"),
             node("Add", ["r1", "r2"], "sum"), node("Exp", ["sum"], "y"),
             node("Neg", ["y"], "z")]
    layers = check(tiny_model(nodes, X, {"y": None, "z": None}))
    assert [set(layer.nodes) for layer in layers] == [
        {"s", "silu"}, {"r1", "r2", "sum", "y"}, {"z"}]
    assert layers[0].inputs == {"x0": "x"}
    assert layers[1].inputs == {"x0": "silu"}


def test_long_chains_are_cut(tiny_model: TinyModel) -> None:
    needs("elementwise")
    count = MAX_INSTRUCTIONS + 8
    nodes = [node("Neg", ["x" if i == 0 else f"n{i - 1}"], f"n{i}") for i in range(count)]
    layers = check(tiny_model(nodes, X, {f"n{count - 1}": None}))
    assert [len(layer.nodes) for layer in layers] == [MAX_INSTRUCTIONS, 8]


# --- single-node operators -----------------------------------------------------------------


def test_reductions_and_global_pools(tiny_model: TinyModel) -> None:
    needs("reduce")
    axes = {"a": np.array([2, 3], np.int64), "b": np.array([1], np.int64)}
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], name="m", axes=[-1], keepdims=1),
             helper.make_node("ReduceSum", ["x", "a"], ["s"], name="s", keepdims=0),
             helper.make_node("ReduceMax", ["x"], ["k"], name="k", axes=[1, 2], keepdims=0),
             node("GlobalAveragePool", ["x"], "g"), node("GlobalMaxPool", ["x"], "h")]
    layers = check(tiny_model(nodes, X, dict.fromkeys("mskgh"), {"a": axes["a"]}))
    got = {layer.output: (layer.op.mode, layer.op.outer, layer.op.reduced,  # type: ignore
                          layer.op.inner) for layer in layers}  # type: ignore[attr-defined]
    assert got == {"m": ("mean", 96, 5, 1), "s": ("sum", 16, 30, 1), "k": ("max", 2, 48, 5),
                   "g": ("mean", 16, 30, 1), "h": ("max", 16, 30, 1)}


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [2, 3], "ceil_mode": 1},
    {"kernel_shape": [3, 2], "auto_pad": "SAME_UPPER", "strides": [2, 1]},
    {"kernel_shape": [3, 3], "dilations": [2, 1], "pads": [2, 0, 1, 1]},
])
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pooling(op: str, attrs: dict[str, Any], tiny_model: TinyModel) -> None:
    needs("pool2d")
    if op == "AveragePool" and "dilations" in attrs:
        attrs = {**attrs, "count_include_pad": 1}
    opset = 19 if op == "AveragePool" else 17  # dilations for AveragePool came with 19
    (layer,) = check(tiny_model([node(op, ["x"], "y", **attrs)], {"x": (1, 3, 11, 9)},
                                {"y": None}, opset=opset))
    assert layer.op.kind == "pool2d"


@pytest.mark.parametrize(("opset", "axis", "shape", "rows_cols"), [
    (13, -1, (2, 3, 7), (6, 7)), (13, 1, (4, 9, 1), (4, 9)), (11, 1, (2, 3, 7), (2, 21))])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_axis_by_opset(op: str, opset: int, axis: int, shape: tuple[int, ...],
                               rows_cols: tuple[int, int], tiny_model: TinyModel) -> None:
    needs("softmax", "logsoftmax")
    (layer,) = check(tiny_model([node(op, ["x"], "y", axis=axis)], {"x": shape}, {"y": None},
                                opset=opset))
    assert (layer.op.rows, layer.op.cols) == rows_cols  # type: ignore[attr-defined]


def test_layer_normalization_and_its_decomposed_form(tiny_model: TinyModel) -> None:
    needs("layernorm")
    rng = np.random.default_rng(2)
    weights = {"g": rng.uniform(0.5, 1.5, 5).astype(np.float32),
               "b": rng.standard_normal(5).astype(np.float32),
               "two": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32)}
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], name="ln",
                              epsilon=1e-3),
             helper.make_node("ReduceMean", ["x"], ["mu"], name="mu", axes=[-1]),
             node("Sub", ["x", "mu"], "d"), node("Pow", ["d", "two"], "sq"),
             helper.make_node("ReduceMean", ["sq"], ["var"], name="var", axes=[-1]),
             node("Add", ["var", "eps"], "ve"), node("Sqrt", ["ve"], "sd"),
             node("Div", ["d", "sd"], "n"), node("Mul", ["n", "g"], "ng"),
             node("Add", ["ng", "b"], "y")]
    layers = check(tiny_model(nodes, X, {"ln": None, "y": None}, weights))
    assert [(layer.op.kind, len(layer.nodes)) for layer in layers] == [
        ("layernorm", 1), ("layernorm", 9)]
    assert layers[1].inputs == {"x": "x", "gamma": "g", "beta": "b"}
    assert math.isclose(layers[1].op.eps, 1e-5, rel_tol=1e-6)  # type: ignore[attr-defined]


def test_data_movement(tiny_model: TinyModel) -> None:
    needs("concat", "slice", "transpose")
    consts = {"st": np.array([1, -4], np.int64), "en": np.array([100, 0], np.int64),
              "ax": np.array([1, 3], np.int64), "sp": np.array([2, -1], np.int64),
              "st2": np.array([0, 1], np.int64), "en2": np.array([6, 5], np.int64),
              "ax2": np.array([2, 3], np.int64), "sp2": np.array([2, 3], np.int64),
              "sizes": np.array([3, 5], np.int64)}
    nodes = [node("Transpose", ["x"], "t", perm=[0, 2, 3, 1]),
             node("Concat", ["x", "x"], "c", axis=2),
             node("Slice", ["x", "st2", "en2", "ax2", "sp2"], "s"),
             helper.make_node("Split", ["x", "sizes"], ["p0", "p1"], name="split", axis=1),
             node("Gather", ["x", "at"], "g", axis=2)]
    consts["at"] = np.array(-2, np.int64)
    layers = check(tiny_model(nodes, X, dict.fromkeys(["t", "c", "s", "p0", "p1", "g"]),
                              consts))
    assert [layer.op.kind for layer in layers] == ["transpose", "concat", "slice", "slice",
                                                   "slice", "slice"]
    assert layers[5].op.starts == (0, 0, 4, 0)  # type: ignore[attr-defined]
    assert layers[1].op.widths == (30, 30)  # type: ignore[attr-defined]
    assert layers[2].op.steps == (1, 1, 2, 3)  # type: ignore[attr-defined]
    assert [layer.nodes for layer in layers[3:5]] == [("split",), ("split",)]


# --- refusals ------------------------------------------------------------------------------


def test_refusals_stay_numpy(tiny_model: TinyModel) -> None:
    consts = {"e": np.array([1, 2], np.float32), "st": np.array([4], np.int64),
              "en": np.array([0], np.int64), "ax": np.array([1], np.int64),
              "sp": np.array([-1], np.int64)}
    nodes = [node("Pow", ["x", "e"], "pow"),  # exponent not a scalar
             node("Softmax", ["x"], "sm", axis=1),  # opset 13: not the contiguous tail
             helper.make_node("ReduceMean", ["x"], ["rm"], name="rm", axes=[1, 3]),
             node("Slice", ["x", "st", "en", "ax", "sp"], "neg_step"),
             helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["bn"],
                              name="bn"),  # parameters are graph inputs, not constants
             node("Reshape", ["x", "shape"], "view"),
             node("Gather", ["x", "two"], "gather2"),  # more than one index
             node("Add", ["e", "e"], "folded")]  # constant: the runner folds it
    inputs = {"x": (2, 8, 6, 2), **{n: (8,) for n in "gbmv"}}
    weights = {**consts, "shape": np.array([2, -1], np.int64), "two": np.array([0, 1], np.int64)}
    assert plan(tiny_model(nodes, inputs, dict.fromkeys(
        ["pow", "sm", "rm", "neg_step", "bn", "view", "gather2", "folded"]), weights)) == []


def test_dynamic_and_non_float_tensors_stay_numpy(tiny_model: TinyModel) -> None:
    dynamic = tiny_model([node("Relu", ["x"], "y")], {"x": ("batch", 4)}, {"y": ("batch", 4)})
    assert plan(dynamic) == []
    ints = tiny_model([node("Abs", ["x"], "y")], {"x": (2, 4)}, {"y": (2, 4)},
                      elem_type=onnx.TensorProto.INT64)
    assert plan(ints) == []


def test_tuned_layers_keep_their_nodes(sample_model: Any) -> None:
    """Nothing a tuned layer covers is planned again; every planned node exists once."""
    needs("elementwise", "reduce")
    proto = load_model(sample_model("resnet18"))
    layers = plan_layers(proto)
    covered = {n for layer in layers for n in layer.nodes}
    planned = [n for layer in plan_generated(proto, layers) for n in layer.nodes]
    assert not covered & set(planned) and len(planned) == len(set(planned))
    assert "avgpool" in planned


def test_a_missing_operator_class_leaves_its_nodes_to_numpy(tiny_model: TinyModel,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    import tuner_service.compiler.frontend.generated_context as context
    from schedule_templates.ops.base import GeneratedOpError, op_from_json

    def without_softmax(data: Any) -> Any:
        if data["kind"] == "softmax":
            raise GeneratedOpError("unknown generated operator 'softmax'")
        return op_from_json(data)

    monkeypatch.setattr(context, "op_from_json", without_softmax)
    model = tiny_model([node("Relu", ["x"], "r"), node("Softmax", ["r"], "s"),
                        node("Neg", ["s"], "y")], X, {"y": None})
    assert [layer.nodes for layer in plan(model)] == [("r",), ("y",)]
