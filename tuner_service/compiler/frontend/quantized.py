"""Quantized models: rewrite each quantized Conv / MatMul / Gemm into one ``Int8Layer`` node.

Two forms onnxruntime's quantizer writes are recognised (``quantize_static``):

- QDQ: ``DequantizeLinear(x_q) -> Conv|MatMul|Gemm <- DequantizeLinear(w_q)`` (bias:
  ``DequantizeLinear`` of an int32 constant), optionally ``-> Relu``, then ``QuantizeLinear``;
- QOperator: ``QLinearConv`` and ``QLinearMatMul`` with a constant weight.

When the activation is uint8 and the weight a constant int8 tensor with zero points of zero (per
tensor or per output channel), the group becomes an ``Int8Layer`` (``quantized_ops``) whose
``workload`` is a ``dense_int8`` or ``conv2d_int8`` task: the requantization (x_scale * w_scale /
y_scale, round half to even, zero point, saturation) is its epilogue; a layer without a
``QuantizeLinear`` after it keeps the fp32 output (scale x_scale * w_scale). Everything else
(a QuantizeLinear or DequantizeLinear standing alone, QLinearAdd, uint8 weights) is left as it
is and runs as a numpy operator. A weight zero point other than zero is refused with a
``ModelError`` (int8 kernels take symmetric weights: quantize with ``weight_type=QInt8``).

``loading.load_model`` applies the rewrite, so extraction, the layer plans and the runner all
see the same graph; the rewritten graph is valid ONNX (custom domain, outputs keep their
inferred types) and rewriting it again changes nothing.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.workloads import Workload, make_workload
from schedule_templates.workloads.lowp import narrow_weights
from tuner_service.compiler.frontend.errors import ModelError, UnmappableNode
from tuner_service.compiler.frontend.quantized_graph import Group, QuantGraph, scalar_constant
from tuner_service.compiler.frontend.quantized_ops import INT8_DOMAIN, INT8_OP, as_float, int8_conv

logger = logging.getLogger(__name__)

_ANCHORS = ("Conv", "MatMul", "Gemm")
_QOPERATORS = ("QLinearConv", "QLinearMatMul")
_DEFAULT = ("", "ai.onnx")
_QGEMM = ("com.microsoft", "QGemm")
_MAX_COMPOSED = 4


@dataclasses.dataclass
class _Parts:
    """What a matcher found: the int8 operands and the output side."""

    anchor: int
    data: str
    data_zp: np.ndarray
    weight: np.ndarray  # int8, the workload's layout
    scale: np.ndarray  # fp32: x_scale * w_scale (divided by y_scale when quantized)
    bias: np.ndarray | None
    absorbed: set[int]


def rewrite_quantized(proto: onnx.ModelProto) -> int:
    """Replace every recognised quantized layer of ``proto`` in place, then the quantized
    residual additions between them (``quantized_glue``; a bias addition right after a
    ``dense_int8`` layer is fused into it, ``quantized_bias``, and a shortcut addition right
    after a ``conv2d_int8`` layer, ``quantized_residual``), unary chains and scalar glue as
    tables, and 8-bit data movement; returns how many nodes were made.

    Raises ModelError for a quantized layer whose parameters are inconsistent (a non-constant
    or non-scalar activation scale, a weight zero point other than zero, ...).
    """
    from tuner_service.compiler.frontend.quantized_bias import fused_bias_adds
    from tuner_service.compiler.frontend.quantized_glue import (
        int8_add_groups,
        requantize_free_moves,
    )
    from tuner_service.compiler.frontend.quantized_residual import fused_residual_adds
    from tuner_service.compiler.frontend.quantized_scalar import composed_tables, scalar_tables
    from tuner_service.compiler.frontend.quantized_table import table_groups

    if not is_quantized(proto):
        return 0
    made = apply_groups(proto, list(_groups(QuantGraph(proto.graph))))
    made += apply_groups(proto, list(int8_add_groups(QuantGraph(proto.graph))))
    made += apply_groups(proto, list(fused_bias_adds(QuantGraph(proto.graph))))
    made += apply_groups(proto, list(fused_residual_adds(QuantGraph(proto.graph))))
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 17)
    made += apply_groups(proto, list(table_groups(QuantGraph(proto.graph), opset)))
    made += apply_groups(proto, list(scalar_tables(QuantGraph(proto.graph))))
    for _ in range(_MAX_COMPOSED):  # each round composes one more level of a table chain
        composed = apply_groups(proto, list(composed_tables(QuantGraph(proto.graph))))
        made += composed
        if not composed:
            break
    made += apply_groups(proto, list(requantize_free_moves(QuantGraph(proto.graph))))
    _drop_dead_dequantize(proto.graph)
    logger.debug("rewrote %d quantized nodes into the %s domain", made, INT8_DOMAIN)
    return made


def _drop_dead_dequantize(graph: onnx.GraphProto) -> None:
    """Drop the DequantizeLinear nodes nothing reads any more: where a residual block's output
    fed both an int8 layer and an addition, both now read the 8-bit tensor, and its fp32 copy
    (a full pass over the activation per run: 1.3 ms of ResNet-50 int8's 34 ms here) went
    nowhere."""
    from tuner_service.compiler.frontend.shapes import reads

    read = set(reads(graph)) | {value.name for value in graph.output}  # subgraphs' reads too
    keep = [node for node in graph.node  # and the Constants a table absorbed
            if node.op_type not in ("DequantizeLinear", "Constant")
            or node.domain not in ("", "ai.onnx") or any(out in read for out in node.output)]
    if len(keep) < len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)


def apply_groups(proto: onnx.ModelProto, groups: list[Group]) -> int:
    """Put each group's node in the place of its last node and drop the others."""
    if not groups:
        return 0
    graph = proto.graph
    by_last = {group.last: group for group in groups}
    removed = set().union(*(group.nodes for group in groups))
    nodes = []
    for position, node in enumerate(graph.node):
        if position in by_last:
            nodes.append(by_last[position].node)
        elif position not in removed:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    for group in groups:
        graph.initializer.extend(group.initializers)
    if not any(entry.domain == INT8_DOMAIN for entry in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid(INT8_DOMAIN, 1))
    return len(groups)


def is_quantized(proto: onnx.ModelProto) -> bool:
    """True when the graph has (de)quantization or quantized operators."""
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear", "QGemm", *_QOPERATORS)
               for n in proto.graph.node)


def _groups(view: QuantGraph) -> Iterator[Group]:
    claimed: set[int] = set()
    for position, node in enumerate(view.graph.node):
        if position in claimed or (node.domain not in _DEFAULT
                                   and (node.domain, node.op_type) != _QGEMM):
            continue
        try:
            if node.op_type in _ANCHORS:
                group = _qdq_group(view, position)
            elif node.op_type in _QOPERATORS or (node.domain, node.op_type) == _QGEMM:
                group = _qoperator_group(view, position)
            else:
                continue
        except (UnmappableNode, InvalidWorkloadError) as e:
            logger.debug("node %s stays as it is: %s", node.name or position, e)
            continue
        if group is not None and not claimed & group.nodes:
            claimed |= group.nodes
            yield group


def _weight_zero(view: QuantGraph, name: str, node: str) -> None:
    zp = view.constant(name) if name else np.zeros(1, np.int8)
    if zp is None:
        raise UnmappableNode(f"the weight zero point {name!r} is not a constant")
    if np.any(zp != 0):
        raise ModelError(f"quantized node {node!r}: the weight zero point {name!r} is not zero; "
                         "int8 kernels take symmetric weights (quantize with "
                         "weight_type=QuantType.QInt8)")


def _channel_scale(view: QuantGraph, name: str, channels: int, node: str) -> np.ndarray:
    value = view.constant(name)
    if value is None:
        raise UnmappableNode(f"the weight scale {name!r} is not a constant")
    if value.size not in (1, channels):
        raise ModelError(f"quantized node {node!r}: the weight scale {name!r} has {value.size} "
                         f"values; expected 1 or one per output channel ({channels})")
    return value.astype(np.float32).reshape(-1)


def _qdq_group(view: QuantGraph, position: int) -> Group | None:
    """A Conv/MatMul/Gemm between DequantizeLinear inputs (and, optionally, a Quantize)."""
    anchor = view.graph.node[position]
    name = anchor.name or f"{anchor.op_type}_{position}"
    dq_x = view.made_by(anchor.input[0], "DequantizeLinear")
    dq_w = view.made_by(anchor.input[1], "DequantizeLinear")
    if dq_x is None or dq_w is None or view.constant(dq_w.input[0]) is None:
        return None
    x_q, w_q = dq_x.input[0], view.constant(dq_w.input[0])
    assert w_q is not None
    if view.info.tensors.get(x_q, None) is None or w_q.dtype != np.int8:
        return None
    if view.info.tensors[x_q].elem_type != onnx.TensorProto.UINT8:
        return None
    x_scale = scalar_constant(view, dq_x.input[1], "activation scale", name)
    x_zp = scalar_constant(view, dq_x.input[2], "activation zero point", name) if len(
        dq_x.input) > 2 and dq_x.input[2] else np.zeros(1, np.uint8)
    _weight_zero(view, dq_w.input[2] if len(dq_w.input) > 2 else "", name)
    fp32, weight, channels = _anchor_geometry(view, anchor, w_q)
    w_scale = _channel_scale(view, dq_w.input[1], channels, name)
    bias = _qdq_bias(view, anchor, name)
    if bias is False:
        return None
    absorbed = {position, view.producer[anchor.input[1]]} if view.only_reader(
        anchor.input[1]) == position else {position}
    if view.only_reader(anchor.input[0]) == position:
        absorbed.add(view.producer[anchor.input[0]])
    if isinstance(bias, tuple):
        bias_array, bias_node = bias
        absorbed |= {bias_node} if view.only_reader(anchor.input[2]) == position else set()
    else:
        bias_array = None
    scale = (np.float32(x_scale[0]) * w_scale).astype(np.float32)
    parts = _Parts(position, x_q, x_zp.astype(np.uint8), weight, scale, bias_array, absorbed)
    return _finish(view, parts, fp32, name)


def _qdq_bias(view: QuantGraph, anchor: onnx.NodeProto, name: str
              ) -> tuple[np.ndarray, int] | bool | None:
    """(int32 bias, its DequantizeLinear's position), None without a bias, False when the
    bias is not an int32 constant behind a DequantizeLinear (the layer stays fp32)."""
    if len(anchor.input) < 3 or not anchor.input[2]:
        return None
    dq_b = view.made_by(anchor.input[2], "DequantizeLinear")
    value = view.constant(dq_b.input[0]) if dq_b is not None else None
    if dq_b is None or value is None or value.dtype != np.int32:
        return False
    if len(dq_b.input) > 2 and dq_b.input[2]:
        _weight_zero(view, dq_b.input[2], name)
    return value.reshape(-1).astype(np.int32), view.producer[anchor.input[2]]


def _anchor_geometry(view: QuantGraph, anchor: onnx.NodeProto, w_q: np.ndarray
                     ) -> tuple[Workload, np.ndarray, int]:
    """(the fp32 workload, the int8 weight in the int8 workload's layout, output channels)."""
    from tuner_service.compiler.frontend.conv import map_conv
    from tuner_service.compiler.frontend.matmul import map_gemm, map_matmul

    info = as_float(view.info, anchor.input[0])
    if anchor.op_type == "Conv":
        fp32 = map_conv(anchor, info)
        return fp32, w_q, int(w_q.shape[0])
    fp32 = (map_gemm if anchor.op_type == "Gemm" else map_matmul)(anchor, info)
    if fp32.op != "dense" or w_q.ndim != 2:
        raise UnmappableNode("a product of two activations has no int8 template")
    if anchor.op_type == "Gemm" and (_attr(anchor, "alpha", 1.0) != 1.0
                                     or _attr(anchor, "beta", 1.0) != 1.0):
        raise UnmappableNode("Gemm with alpha or beta other than 1")
    transposed = anchor.op_type == "Gemm" and bool(_attr(anchor, "transB", 0))
    weight = w_q if transposed else w_q.T
    return fp32, np.ascontiguousarray(weight), int(weight.shape[0])


def _attr(node: onnx.NodeProto, key: str, default: float) -> float:
    for attr in node.attribute:
        if attr.name == key:
            return float(onnx.helper.get_attribute_value(attr))
    return default


def _finish(view: QuantGraph, parts: _Parts, fp32: Workload, name: str) -> Group:
    """Follow the anchor's output through an optional Relu to a QuantizeLinear."""
    output = view.graph.node[parts.anchor].output[0]
    nodes, relu = set(parts.absorbed), False
    nxt = view.only_reader(output)
    if nxt is not None and view.graph.node[nxt].op_type == "Relu":
        relu, output = True, view.graph.node[nxt].output[0]
        nodes.add(nxt)
        nxt = view.only_reader(output)
    quant = view.graph.node[nxt] if nxt is not None else None
    y_zp: np.ndarray | None = None
    scale = parts.scale
    if quant is not None and quant.op_type == "QuantizeLinear" and quant.domain in _DEFAULT:
        y_scale = scalar_constant(view, quant.input[1], "output scale", name)
        y_zp = scalar_constant(view, quant.input[2], "output zero point", name) if len(
            quant.input) > 2 and quant.input[2] else np.zeros(1, np.uint8)
        scale = (scale / np.float32(y_scale[0])).astype(np.float32)
        output = quant.output[0]
        nodes.add(nxt)  # type: ignore[arg-type]
    workload = _int8_workload(fp32, y_zp, scale, parts.bias, parts.weight)
    return _make_group(view, parts, nodes, workload, scale, y_zp, relu, output, name)


def _int8_workload(fp32: Workload, y_zp: np.ndarray | None, scale: np.ndarray,
                   bias: np.ndarray | None, weight: np.ndarray) -> Workload:
    """The layer's task; ``weights=narrow`` where every weight is within [-64, 64] (a model
    quantized with ``reduce_range``), which hosts without VNNI multiply on bytes."""
    if y_zp is None:
        out = "f32"
    elif y_zp.dtype in (np.uint8, np.int8):
        out = "u8" if y_zp.dtype == np.uint8 else "s8"
    else:
        raise UnmappableNode(f"output type {y_zp.dtype} has no int8 kernel")
    per = "channel" if scale.size > 1 else "tensor"
    with_bias = "none" if bias is None else "s32"
    weights = "narrow" if narrow_weights(weight) else "full"
    if fp32.op == "dense":
        return make_workload("dense_int8", M=fp32.M, N=fp32.N, K=fp32.K,  # type: ignore[attr-defined]
                             out=out, scale=per, bias=with_bias, weights=weights)
    return int8_conv(fp32, out=out, scale=per, bias=with_bias, weights=weights)


def _make_group(view: QuantGraph, parts: _Parts, nodes: set[int], workload: Workload,
                scale: np.ndarray, y_zp: np.ndarray | None, relu: bool, output: str,
                name: str) -> Group:
    try:
        shape = view.info.static_shape(output, "output")
    except UnmappableNode:  # an operator onnx has no schema for (QGemm): the kernel's shape
        shape = workload.output_shape()
    prefix = f"{name}.int8"
    arrays = {"weight": parts.weight, "data_zero_point": parts.data_zp, "scale": scale}
    if parts.bias is not None:
        arrays["bias"] = parts.bias
    if y_zp is not None:
        arrays["out_zero_point"] = y_zp
    initializers = [onnx.numpy_helper.from_array(np.ascontiguousarray(v), f"{prefix}.{k}")
                    for k, v in arrays.items()]
    inputs = [parts.data] + [f"{prefix}.{k}" if k in arrays else "" for k in
                             ("weight", "data_zero_point", "scale", "bias", "out_zero_point")]
    while inputs and not inputs[-1]:
        inputs.pop()
    node = onnx.helper.make_node(INT8_OP, inputs, [output], f"{name}", domain=INT8_DOMAIN,
                                 workload=workload.key, relu=int(relu), shape=list(shape))
    return Group(nodes, node, initializers)


# operator -> positions of (y_scale, y_zero_point, bias); data, scales and weight come first
_QOPERATOR_INPUTS = {"QLinearConv": (6, 7, 8), "QLinearMatMul": (6, 7, -1), "QGemm": (7, 8, 6)}
_QOPERATOR_ANCHOR = {"QLinearConv": "Conv", "QLinearMatMul": "MatMul", "QGemm": "Gemm"}


def _input(node: onnx.NodeProto, position: int) -> str:
    return node.input[position] if 0 <= position < len(node.input) else ""


def _qoperator_group(view: QuantGraph, position: int) -> Group | None:
    """QLinearConv / QLinearMatMul / QGemm with a constant int8 weight and uint8 activations."""
    node = view.graph.node[position]
    name = node.name or f"{node.op_type}_{position}"
    w_q = view.constant(node.input[3])
    info = view.info.tensors.get(node.input[0])
    if w_q is None or w_q.dtype != np.int8 or info is None or (
            info.elem_type != onnx.TensorProto.UINT8):
        return None
    x_scale = scalar_constant(view, node.input[1], "activation scale", name)
    x_zp = scalar_constant(view, node.input[2], "activation zero point", name)
    _weight_zero(view, _input(node, 5), name)
    y_at, zp_at, bias_at = _QOPERATOR_INPUTS[node.op_type]
    anchor = onnx.helper.make_node(_QOPERATOR_ANCHOR[node.op_type],
                                   [node.input[0], node.input[3]], ["_"], name)
    anchor.attribute.extend(node.attribute)
    fp32, weight, channels = _anchor_geometry(view, anchor, w_q)
    scale = (np.float32(x_scale[0]) * _channel_scale(view, node.input[4], channels, name))
    y_zp = None
    if _input(node, y_at):  # QGemm without y_scale has an fp32 output
        scale = scale / np.float32(scalar_constant(view, node.input[y_at], "output scale", name)[0])
        y_zp = (scalar_constant(view, _input(node, zp_at), "output zero point", name)
                if _input(node, zp_at) else np.zeros(1, np.uint8))
    bias = view.constant(_input(node, bias_at)) if _input(node, bias_at) else None
    if _input(node, bias_at) and bias is None:
        return None  # a bias computed at run time: numpy runs the node
    if bias is not None and bias.dtype != np.int32:
        raise ModelError(f"quantized node {name!r}: the bias {_input(node, bias_at)!r} is "
                         f"{bias.dtype}; {node.op_type} takes an int32 bias")
    parts = _Parts(position, node.input[0], x_zp.astype(np.uint8), weight,
                   scale.astype(np.float32), None if bias is None else bias.reshape(-1),
                   {position})
    workload = _int8_workload(fp32, y_zp, parts.scale, parts.bias, parts.weight)
    return _make_group(view, parts, {position}, workload, parts.scale, y_zp, False,
                       node.output[0], name)
