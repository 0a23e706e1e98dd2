"""Hostile and broken inputs: every one is a ModelError with a reason, nothing else escapes."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402

from tuner_service.compiler.frontend.errors import FrontendError, ModelError  # noqa: E402
from tuner_service.compiler.frontend.extract import extract_tasks  # noqa: E402


@pytest.fixture
def small_model(tiny_model: Any) -> Any:
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], "conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"], "relu"),
    ]
    w = np.ones((4, 3, 3, 3), dtype=np.float32)
    return tiny_model(nodes, {"x": (1, 3, 8, 8)}, {"y": None}, {"w": w})


def test_model_error_is_a_frontend_error() -> None:
    assert issubclass(ModelError, FrontendError)


def test_empty_file() -> None:
    with pytest.raises(ModelError, match="empty"):
        extract_tasks(b"")


def test_random_bytes() -> None:
    with pytest.raises(ModelError, match="not an ONNX model"):
        extract_tasks(np.random.default_rng(3).bytes(4096))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_arbitrary_bytes_never_escape_as_other_errors(data: bytes) -> None:
    try:
        extract_tasks(data)
    except ModelError as e:
        assert str(e)


def test_every_truncation_of_a_model_is_refused(small_model: Any) -> None:
    data = small_model.SerializeToString()
    assert extract_tasks(data).tasks  # the whole model is fine
    for cut in range(len(data)):
        with pytest.raises(ModelError):
            extract_tasks(data[:cut])


def test_truncated_sample_model_is_refused(sample_model: Any) -> None:
    data = sample_model("bert_block").SerializeToString()
    with pytest.raises(ModelError, match="truncated"):
        extract_tasks(data[: len(data) // 2])


def test_other_protobuf_message_is_refused(small_model: Any) -> None:
    with pytest.raises(ModelError):
        extract_tasks(small_model.graph.SerializeToString())


def test_wrong_argument_type_is_a_bug() -> None:
    with pytest.raises(TypeError):
        extract_tasks("model.onnx")  # type: ignore[arg-type]


def _point_outside(tensor: Any, location: str) -> None:
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location


@pytest.mark.parametrize("location", ["/etc/passwd", "../../secret.bin", "missing.bin"])
def test_external_initializer_is_refused(small_model: Any, location: str) -> None:
    _point_outside(small_model.graph.initializer[0], location)
    for form in (small_model, small_model.SerializeToString()):
        with pytest.raises(ModelError, match="external file"):
            extract_tasks(form)


def test_external_constant_node_is_refused(small_model: Any) -> None:
    value = numpy_helper.from_array(np.ones((4,), dtype=np.float32), "bias")
    _point_outside(value, "/etc/hostname")
    small_model.graph.node.insert(0, helper.make_node("Constant", [], ["bias"], value=value))
    with pytest.raises(ModelError, match="external file"):
        extract_tasks(small_model)


def test_external_tensor_in_subgraph_is_refused(small_model: Any) -> None:
    inner = numpy_helper.from_array(np.ones((2,), dtype=np.float32), "inner")
    _point_outside(inner, "/etc/hostname")
    branch = helper.make_graph(
        [helper.make_node("Identity", ["inner"], ["z"])],
        "then",
        [],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [2])],
        initializer=[inner],
    )
    node = helper.make_node("If", ["cond"], ["out"], then_branch=branch, else_branch=branch)
    small_model.graph.node.append(node)
    with pytest.raises(ModelError, match="external file"):
        extract_tasks(small_model)


def test_unknown_operator_is_refused(tiny_model: Any) -> None:
    node = helper.make_node("NoSuchOp", ["x"], ["y"])
    model = tiny_model([node], {"x": (2, 2)}, {"y": (2, 2)})
    with pytest.raises(ModelError, match="invalid ONNX model"):
        extract_tasks(model)


def test_inconsistent_shapes_are_refused(tiny_model: Any) -> None:
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    w = np.ones((5, 3), dtype=np.float32)
    model = tiny_model([node], {"x": (2, 4)}, {"y": (2, 3)}, {"w": w})
    with pytest.raises(ModelError, match="cannot be inferred"):
        extract_tasks(model)


def test_error_messages_are_one_line(small_model: Any) -> None:
    bad = small_model.SerializeToString()[:-7]
    for data in (b"", os.urandom(64), bad):
        with pytest.raises(ModelError) as info:
            extract_tasks(data)
        assert "\n" not in str(info.value)
