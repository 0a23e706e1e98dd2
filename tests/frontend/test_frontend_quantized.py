"""Quantized ONNX models (onnxruntime's QDQ, QOperator and dynamic forms) become int8 tasks;
malformed ones are a ModelError with a sentence, never a traceback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper as nh
import pytest

from tests.frontend.quantized_models import quantized
from tuner_service.compiler.frontend.errors import ModelError
from tuner_service.compiler.frontend.extract import extract_tasks
from tuner_service.compiler.frontend.loading import load_model
from tuner_service.compiler.frontend.quantized_ops import INT8_DOMAIN

pytest.importorskip("onnxruntime.quantization")

CONV = "conv2d_int8:N=1,C=3,H=8,W=8,K=16,R=3,S=3,stride=2,pad=1"


@pytest.mark.parametrize(("form", "keys"), [
    # the MatMul's bias addition is fused into its layer (``add=u8``); 7-bit weights
    # (``reduce_range``) are narrow
    ("qdq", [f"{CONV},bias=s32,weights=narrow", "dense_int8:M=1,N=32,K=256,weights=narrow,add=u8",
             "dense_int8:M=1,N=10,K=32,bias=s32,weights=narrow"]),
    # QGemm reads QLinearAdd's output, which onnx (no com.microsoft schemas) cannot type
    ("qoperator", [f"{CONV},bias=s32,weights=narrow", "dense_int8:M=1,N=32,K=256,weights=narrow"]),
    ("dynamic", [f"{CONV},out=f32,scale=tensor", "dense_int8:M=1,N=32,K=256,out=f32,scale=tensor",
                 "dense_int8:M=1,N=10,K=32,out=f32,scale=tensor"]),
])
def test_quantized_layers_become_int8_tasks(tmp_path: Path, form: str, keys: list[str]) -> None:
    result = extract_tasks(quantized(tmp_path, form))
    found = [task.workload.key for task in result.tasks]
    if form == "dynamic":  # onnxruntime quantizes Gemm dynamically only as MatMul + Add
        keys = [k for k in keys if "N=10" not in k or k in found]
    assert found == keys
    assert not [u for u in result.unsupported if "int8" in u.reason]


def test_full_range_weights_make_full_keys(tmp_path: Path) -> None:
    """Weights quantized without ``reduce_range`` reach +-127: no key promises narrow ones."""
    keys = [t.workload.key for t in extract_tasks(quantized(tmp_path, "qdq",
                                                            reduce_range=False),
                                                  int8="exact").tasks]
    assert len(keys) == 3 and not [k for k in keys if "weights=" in k]


def test_qdq_layers_are_rewritten_and_no_fp32_anchor_is_left(tmp_path: Path) -> None:
    proto = load_model(quantized(tmp_path, "qdq"))
    ops = [(n.domain, n.op_type) for n in proto.graph.node]
    assert ops.count((INT8_DOMAIN, "Int8Layer")) == 3
    assert ops.count((INT8_DOMAIN, "Int8Add")) == 0  # the MatMul's bias: fused into its layer
    # Flatten runs on the uint8 tensor: only the input's Quantize, the output's Dequantize stay
    assert ops.count(("", "DequantizeLinear")) == ops.count(("", "QuantizeLinear")) == 1
    assert not {"Conv", "MatMul", "Gemm"} & {op for _, op in ops}
    again = load_model(proto)  # rewriting a rewritten model changes nothing
    assert [n.op_type for n in again.graph.node] == [n.op_type for n in proto.graph.node]


def test_a_residual_input_read_as_8_bits_leaves_no_dead_dequantize(tmp_path: Path) -> None:
    """The residual block's input feeds two int8 layers (the 3x3 and the shortcut): both read
    its uint8 tensor after the rewrite, so its DequantizeLinear (read by nothing) is gone. The
    block's addition is fused into the 3x3 layer (``quantized_residual``)."""
    proto = load_model(quantized(tmp_path, "qdq", residual=True))
    ops = [(n.domain, n.op_type) for n in proto.graph.node]
    assert ops.count((INT8_DOMAIN, "Int8Layer")) == 5 and ops.count((INT8_DOMAIN, "Int8Add")) == 0
    keys = [a.s.decode() for n in proto.graph.node for a in n.attribute if a.name == "workload"]
    assert [k for k in keys if k.endswith(",residual=u8")] == [
        "conv2d_int8:N=1,C=16,H=4,W=4,K=16,R=3,S=3,pad=1,weights=narrow,residual=u8"]
    read = {name for node in proto.graph.node for name in node.input}
    read |= {value.name for value in proto.graph.output}
    assert all(out in read for node in proto.graph.node for out in node.output)


def test_layers_after_a_computed_reshape_are_rewritten_with_static_shapes(
        tmp_path: Path) -> None:
    """A Reshape whose target is computed at run time (onnx's inference gives up at a Div)
    is folded before the rewrite, so the MatMul after it becomes an int8 layer of a static
    shape instead of a numpy fp32 MatMul on dequantized weights."""
    proto = load_model(quantized(tmp_path, "qdq", computed_flatten=True))
    ops = [(n.domain, n.op_type) for n in proto.graph.node]
    assert ops.count((INT8_DOMAIN, "Int8Layer")) == 3 and ("", "MatMul") not in ops
    keys = [task.workload.key for task in
            extract_tasks(quantized(tmp_path, "qdq", computed_flatten=True)).tasks]
    assert "dense_int8:M=1,N=32,K=256,weights=narrow,add=u8" in keys


def test_a_bias_addition_is_fused_into_the_dense_layer_only_when_it_alone_reads_it(
        tmp_path: Path) -> None:
    """The fused layer writes the addition's output and takes its constant dequantized, with
    the scales and zero points on both sides of it; a product whose 8-bit output something
    else reads too (here: a graph output) keeps its separate addition."""
    path = quantized(tmp_path, "qdq")
    proto = load_model(path)
    layer = next(n for n in proto.graph.node if n.name == "mm")
    assert len(layer.input) == 9 and layer.input[6].endswith("add_value")
    constants = {t.name: nh.to_array(t) for t in proto.graph.initializer}
    assert constants[layer.input[6]].dtype == np.float32
    assert constants[layer.input[6]].shape == (32,)
    assert constants[layer.input[7]].dtype == np.float32 and constants[layer.input[7]].size == 2
    assert constants[layer.input[8]].dtype == np.int32 and constants[layer.input[8]].size == 2
    raw = onnx.load(path)
    product = next(n.output[0] for n in raw.graph.node
                   if n.op_type == "QuantizeLinear" and n.input[0] == "m")
    raw.graph.output.append(onnx.helper.make_tensor_value_info(
        product, onnx.TensorProto.UINT8, [1, 32]))
    ops = [(n.domain, n.op_type) for n in load_model(raw).graph.node]
    assert ops.count((INT8_DOMAIN, "Int8Add")) == 1


def _initializer(proto: onnx.ModelProto, suffix: str) -> onnx.TensorProto:
    return next(t for t in proto.graph.initializer if t.name.endswith(suffix))


def _replace(proto: onnx.ModelProto, tensor: onnx.TensorProto, value: np.ndarray) -> None:
    tensor.CopyFrom(nh.from_array(value, tensor.name))


def test_non_zero_weight_zero_point_is_a_model_error(tmp_path: Path) -> None:
    proto = onnx.load(quantized(tmp_path, "qdq"))
    zp = _initializer(proto, "w1_zero_point")
    _replace(proto, zp, np.full(nh.to_array(zp).shape, 3, np.int8))
    with pytest.raises(ModelError, match=r"weight zero point .* is not zero"):
        extract_tasks(proto)


def test_zero_point_of_the_wrong_type_is_a_model_error(tmp_path: Path) -> None:
    proto = onnx.load(quantized(tmp_path, "qdq"))
    _replace(proto, _initializer(proto, "x_zero_point"), np.zeros((), np.int32))
    with pytest.raises(ModelError):
        extract_tasks(proto)


def test_missing_scale_is_a_model_error(tmp_path: Path) -> None:
    proto = onnx.load(quantized(tmp_path, "qoperator"))
    conv = next(n for n in proto.graph.node if n.op_type == "QLinearConv")
    conv.input[1] = ""
    with pytest.raises(ModelError):
        extract_tasks(proto)


def test_per_channel_activation_scale_is_a_model_error(tmp_path: Path) -> None:
    proto = onnx.load(quantized(tmp_path, "qoperator"))
    conv = next(n for n in proto.graph.node if n.op_type == "QLinearConv")
    scale = next(t for t in proto.graph.initializer if t.name == conv.input[1])
    _replace(proto, scale, np.full(3, nh.to_array(scale).reshape(-1)[0], np.float32))
    with pytest.raises(ModelError, match="activation scale"):
        extract_tasks(proto)


def test_a_table_after_a_node_of_one_input_is_left_alone() -> None:
    """Only a table reading another table composes: a table after a one-input producer (a
    byte Transpose, as in a quantized ViT) used to read that producer's missing second input
    (IndexError from ``tuner build``)."""
    from tuner_service.compiler.frontend.quantized_graph import QuantGraph
    from tuner_service.compiler.frontend.quantized_scalar import composed_tables
    from tuner_service.compiler.frontend.quantized_table import INT8_TABLE

    h = onnx.helper
    table = nh.from_array(np.arange(256, dtype=np.uint8)[::-1].copy(), "table")
    nodes = [h.make_node("Transpose", ["x"], ["t"], "swap", perm=[1, 0]),
             h.make_node(INT8_TABLE, ["t", "table"], ["y"], "lookup", domain=INT8_DOMAIN),
             h.make_node(INT8_TABLE, ["y", "table"], ["z"], "again", domain=INT8_DOMAIN)]
    graph = h.make_graph(nodes, "tables",
                         [h.make_tensor_value_info("x", onnx.TensorProto.UINT8, [2, 3])],
                         [h.make_tensor_value_info("z", onnx.TensorProto.UINT8, [3, 2])],
                         [table])
    groups = list(composed_tables(QuantGraph(graph)))
    # the two tables compose into one (the reversal twice: the identity); the Transpose stays
    assert [sorted(g.nodes) for g in groups] == [[1, 2]]
    composed = onnx.numpy_helper.to_array(groups[0].initializers[0])
    np.testing.assert_array_equal(composed, np.arange(256, dtype=np.uint8))
