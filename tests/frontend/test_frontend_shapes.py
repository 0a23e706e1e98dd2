"""Static shapes: folded shape subgraphs, pinned input shapes, reasons for what stays dynamic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tuner_service.compiler.frontend.errors import ModelError  # noqa: E402
from tuner_service.compiler.frontend.extract import extract_tasks  # noqa: E402
from tuner_service.compiler.frontend.loading import load_model  # noqa: E402
from tuner_service.compiler.frontend.shapes import (  # noqa: E402
    format_input_shapes,
    parse_input_shape,
    parse_input_shapes,
)

SHAPE_OPS = {"Shape", "Gather", "Concat", "Div", "Unsqueeze", "Equal", "Where",
             "ConstantOfShape", "Range", "Cast"}


def _int64(name: str, values: list[int]) -> Any:
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def _shape_chain_model(batch: int | str) -> Any:
    """conv -> Reshape(conv, Concat(Gather(Shape(conv), 0), (Shape[1] * 64) / 1)) -> MatMul,
    and an Expand whose shape goes through ConstantOfShape/Equal/Where, as exporters write
    ``expand``; plus a Range over a folded length, cast and added to the MatMul's output."""
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w"], ["c"], "conv", pads=[1, 1, 1, 1]),
        n("Shape", ["c"], ["s"], "shape"),
        n("Gather", ["s", "zero"], ["batch"], "gather_batch", axis=0),
        n("Gather", ["s", "one"], ["channels"], "gather_channels", axis=0),
        n("Mul", ["channels", "sixty_four"], ["mul"], "mul"),
        n("Div", ["mul", "one"], ["features"], "div"),
        n("Unsqueeze", ["batch", "axes"], ["batch_1"], "unsqueeze_batch"),
        n("Unsqueeze", ["features", "axes"], ["features_1"], "unsqueeze_features"),
        n("Concat", ["batch_1", "features_1"], ["flat_shape"], "concat", axis=0),
        n("Reshape", ["c", "flat_shape"], ["flat"], "reshape"),
        n("MatMul", ["flat", "fc"], ["logits"], "fc"),
        # Expand(bias, Where(Equal(target, -1), 1, target)) with target = Shape(logits)
        n("Shape", ["logits"], ["target"], "shape_logits"),
        n("Shape", ["target"], ["rank"], "shape_target"),
        n("ConstantOfShape", ["rank"], ["minus"], "minus_ones",
          value=numpy_helper.from_array(np.asarray([-1], dtype=np.int64))),
        n("Equal", ["target", "minus"], ["is_minus"], "equal"),
        n("ConstantOfShape", ["rank"], ["ones"], "ones",
          value=numpy_helper.from_array(np.asarray([1], dtype=np.int64))),
        n("Where", ["is_minus", "ones", "target"], ["expand_to"], "where"),
        n("Expand", ["bias", "expand_to"], ["bias_full"], "expand"),
        n("Gather", ["target", "one"], ["width"], "gather_width", axis=0),
        n("Range", ["zero", "width", "one"], ["steps"], "range"),
        n("Cast", ["steps"], ["steps_f"], "cast", to=TensorProto.FLOAT),
        n("Add", ["bias_full", "steps_f"], ["biased"], "add_steps"),
        n("Add", ["logits", "biased"], ["y"], "add"),
    ]
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.normal(size=(256, 10)).astype(np.float32), "fc"),
        numpy_helper.from_array(rng.normal(size=(10,)).astype(np.float32), "bias"),
        _int64("zero", [0]), _int64("one", [1]), _int64("sixty_four", [64]), _int64("axes", [0]),
    ]
    # scalar indices: Gather with a 0-d index gives a 0-d value, as exporters write it
    for tensor in weights[3:6]:
        tensor.dims[:] = []
    graph = helper.make_graph(
        nodes, "shape_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])], initializer=weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _ort(model: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    ort = pytest.importorskip("onnxruntime")
    data = model if isinstance(model, bytes | str) else model.SerializeToString()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


def test_shape_chain_folds_to_constants() -> None:
    model = _shape_chain_model(1)
    loaded = load_model(model)
    assert not {n.op_type for n in loaded.graph.node} & SHAPE_OPS
    result = extract_tasks(model)
    assert result.unsupported == []
    assert [t.workload.key for t in result.tasks] == [
        "conv2d:N=1,C=3,H=8,W=8,K=4,R=3,S=3,pad=1", "dense:M=1,N=10,K=256,epilogue=bias"]
    output = loaded.graph.output[0].type.tensor_type.shape
    assert [d.dim_value for d in output.dim] == [1, 10]
    x = np.random.default_rng(1).normal(size=(1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_ort(loaded, {"x": x})[0], _ort(model, {"x": x})[0], rtol=1e-6)


def test_pinned_batch_folds_the_same_chain() -> None:
    model = _shape_chain_model("N")
    dynamic = extract_tasks(model)
    assert dynamic.tasks == []
    assert all("graph input 'x'" in u.reason and "--input-shape x=" in u.reason
               for u in dynamic.unsupported)
    pinned = extract_tasks(model, {"x": (2, 3, 8, 8)})
    assert pinned.unsupported == []
    # the expanded bias folds to a (2, 10) constant: a residual, no longer per channel
    assert [t.workload.key for t in pinned.tasks] == [
        "conv2d:N=2,C=3,H=8,W=8,K=4,R=3,S=3,pad=1", "dense:M=2,N=10,K=256,epilogue=residual"]


def test_input_model_is_not_modified() -> None:
    model = _shape_chain_model("N")
    before = model.SerializeToString()
    load_model(model, {"x": (1, 3, 8, 8)})
    assert model.SerializeToString() == before


def test_shape_that_is_a_graph_output_stays_a_node() -> None:
    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"], "shape")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("s", TensorProto.INT64, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert [n.op_type for n in load_model(model).graph.node] == ["Shape"]


def test_value_computed_from_an_input_stays_dynamic_with_its_reason(tiny_model: Any) -> None:
    # the MatMul's rows come from an int64 input's *values*: nothing can fold that
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"], "reshape"),
             helper.make_node("MatMul", ["r", "w"], ["y"], "mm")]
    model = tiny_model(nodes, {"x": (4, 8)}, {"y": ("rows", 2)},
                       {"w": np.ones((8, 2), np.float32)})
    model.graph.input.append(helper.make_tensor_value_info("shape", TensorProto.INT64, [2]))
    result = extract_tasks(model)
    assert result.tasks == []
    assert "known only at run time" in result.unsupported[0].reason


@pytest.mark.parametrize(("text", "expected"), [
    ("x=1x3x224x224", ("x", (1, 3, 224, 224))),
    ("input_ids=1,128", ("input_ids", (1, 128))),
    ("a=b=[2, 3]", ("a=b", (2, 3))),
    ("scalarish=7", ("scalarish", (7,))),
])
def test_parse_input_shape(text: str, expected: tuple[str, tuple[int, ...]]) -> None:
    assert parse_input_shape(text) == expected


@pytest.mark.parametrize("text", ["x", "x=", "=1x2", "x=1xx2", "x=0x3", "x=-1x3", "x=1.5",
                                  "x=99999999999"])
def test_malformed_input_shapes_are_refused(text: str) -> None:
    with pytest.raises(ModelError, match="input shape"):
        parse_input_shape(text)


def test_input_shapes_round_trip_and_refuse_duplicates() -> None:
    shapes = parse_input_shapes(["b=2", "a=1x3"])
    assert format_input_shapes(shapes) == "a=1x3,b=2"
    assert parse_input_shapes(format_input_shapes(shapes).split(",")) == shapes
    with pytest.raises(ModelError, match="two shapes"):
        parse_input_shapes(["a=1", "a=2"])


@pytest.mark.parametrize(("shapes", "reason"), [
    ({"y": (1, 3, 8, 8)}, "not an input of the model; inputs: x"),
    ({"w": (4, 3, 3, 3)}, "a weight"),
    ({"x": (1, 3, 8)}, "has 4 dimensions, the pinned shape 1x3x8 has 3"),
    ({"x": (1, 4, 8, 8)}, "fixed dimension 3 at axis 1"),
])
def test_pinned_shapes_that_do_not_fit_are_refused(shapes: dict[str, tuple[int, ...]],
                                                   reason: str) -> None:
    with pytest.raises(ModelError, match=reason):
        load_model(_shape_chain_model("N"), shapes)


# -- real exports (torch 2.x, both exporters) ------------------------------------------------

torch = pytest.importorskip("torch")
from shape_models import Attention, ShuffleBlocks, export  # noqa: E402


def _exporters() -> list[Any]:
    dynamo = pytest.param(True, id="dynamo", marks=pytest.mark.skipif(
        not _has("onnxscript"), reason="the dynamo exporter needs onnxscript"))
    return [pytest.param(False, id="torchscript"), dynamo]


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("dynamo", _exporters())
def test_shufflenet_split_convs_get_static_shapes(tmp_path: Path, dynamo: bool) -> None:
    path = export(ShuffleBlocks(), torch.randn(1, 3, 32, 32), tmp_path / "shuffle.onnx", dynamo)
    result = extract_tasks(path)
    assert result.unsupported == []
    keys = {t.workload.key: t.weight for t in result.tasks}
    # each block: 1x1 conv + BN + ReLU, depthwise 3x3, 1x1 conv + ReLU on 8 of the 16 channels
    assert keys["conv2d:N=1,C=8,H=16,W=16,K=8,R=1,S=1,epilogue=bias+relu"] == 6
    assert keys["depthwise_conv2d:N=1,C=8,H=16,W=16,R=3,S=3,pad=1,epilogue=bias"] == 3
    assert sum(keys.values()) == 1 + 9 + 1  # stem, 3 x 3 branch convs, classifier
    x = np.random.default_rng(0).normal(size=(1, 3, 32, 32)).astype(np.float32)
    folded = load_model(path)
    np.testing.assert_allclose(_ort(folded, {"x": x})[0], _ort(str(path), {"x": x})[0],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dynamo", _exporters())
def test_dynamic_batch_and_sequence_are_pinned(tmp_path: Path, dynamo: bool) -> None:
    path = export(Attention(), torch.randn(2, 16, 32), tmp_path / "attention.onnx", dynamo,
                  {0: "batch", 1: "seq"})
    dynamic = extract_tasks(path)
    assert dynamic.tasks == [] and len(dynamic.unsupported) == 6
    assert all("--input-shape x=" in u.reason for u in dynamic.unsupported)
    result = extract_tasks(path, {"x": (1, 128, 32)})
    assert result.unsupported == []
    assert {t.workload.key: t.weight for t in result.tasks} == {
        "dense:M=128,N=32,K=32,epilogue=bias": 4,
        "batch_matmul:B=4,M=128,N=128,K=8": 1,
        "batch_matmul:B=4,M=128,N=8,K=128": 1,
    }
