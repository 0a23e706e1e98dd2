"""The ``tuner.int8`` operator a quantized layer becomes, and the int8 tasks of dynamically
quantized models (MatMulInteger, ConvInteger).

``Int8Layer`` (domain ``tuner.int8``) stands for one quantized Conv, MatMul or Gemm with its
requantization: inputs ``data`` (u8 activation), ``weight`` (s8, in the workload's layout),
``data_zero_point``, ``scale`` (x_scale * w_scale / y_scale, fp32), ``bias`` (int32, or empty)
and ``out_zero_point`` (empty for an fp32 output), then, for a ``dense_int8`` with a fused
quantized addition (``add=u8|s8``, ``quantized_bias``), ``add_value``, ``add_scale`` and
``add_zero_point``, and for a ``conv2d_int8`` with a fused shortcut addition
(``residual=u8|s8``, ``quantized_residual``) the 8-bit ``residual`` activation and
``residual_add``; attributes ``workload`` (a ``dense_int8`` or ``conv2d_int8`` key), ``relu``
(clamp at the output zero point) and ``shape`` (the ONNX output's shape).
``quantized.rewrite_quantized`` writes these nodes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.workloads import Workload, make_workload, parse_workload
from tuner_service.compiler.frontend.errors import UnmappableNode
from tuner_service.compiler.frontend.graph import GraphIndex, TensorInfo

INT8_DOMAIN = "tuner.int8"
INT8_OP = "Int8Layer"
#: Int8Layer's inputs, in order (an omitted optional one is the empty name)
INT8_INPUTS = ("data", "weight", "data_zero_point", "scale", "bias", "out_zero_point",
               "add_value", "add_scale", "add_zero_point", "residual", "residual_add")
#: the inputs read at every run (activations); the others are constants
INT8_ACTIVATIONS = ("data", "residual")

_WINDOW = ("N", "C", "H", "W", "R", "S", "stride", "pad", "dilation")


def int8_layer_inputs(workload: Workload, inputs: Sequence[np.ndarray | None]
                      ) -> dict[str, np.ndarray]:
    """Int8Layer's input arrays by the workload's input names, in its shapes."""
    shapes = workload.input_shapes()
    named = {}
    for position, name in enumerate(INT8_INPUTS):
        value = inputs[position] if position < len(inputs) else None
        if name in shapes and value is not None:
            named[name] = np.asarray(value).reshape(shapes[name])
    return named


def int8_layer_workload(node: onnx.NodeProto) -> Workload:
    """The task of an Int8Layer node (its ``workload`` attribute)."""
    for attr in node.attribute:
        if attr.name == "workload":
            try:
                return parse_workload(attr.s.decode())
            except (InvalidWorkloadError, UnicodeDecodeError) as e:
                raise UnmappableNode(f"malformed int8 workload: {e}") from e
    raise UnmappableNode("Int8Layer node without a workload attribute")


def plain_int8_layer(layer: onnx.NodeProto) -> Workload | None:
    """The workload of an ``Int8Layer`` with an 8-bit output, no ReLU and no input past its
    own six (None for any other node): a layer that an addition after it may fold into."""
    if (layer.domain, layer.op_type) != (INT8_DOMAIN, INT8_OP) \
            or len(layer.input) > INT8_INPUTS.index("add_value"):
        return None
    try:
        workload = int8_layer_workload(layer)
    except UnmappableNode:
        return None
    relu = next((a.i for a in layer.attribute if a.name == "relu"), 0)
    return None if relu or getattr(workload, "out", "f32") == "f32" else workload


def int8_conv(fp32: Workload, **params: object) -> Workload:
    """The ``conv2d_int8`` workload with the geometry of an fp32 conv workload
    (``conv2d``, ``depthwise_conv2d`` or ``group_conv2d``)."""
    window = {name: getattr(fp32, name) for name in _WINDOW}
    if fp32.op == "depthwise_conv2d":
        k, groups = fp32.C * int(getattr(fp32, "multiplier", 1)), fp32.C  # type: ignore[attr-defined]
    else:
        k, groups = int(fp32.K), int(getattr(fp32, "groups", 1))  # type: ignore[attr-defined]
    return make_workload("conv2d_int8", K=k, groups=groups, **window, **params)


def as_float(graph: GraphIndex, name: str) -> GraphIndex:
    """``graph`` with ``name`` typed fp32, so that the fp32 mappers read its geometry."""
    info = graph.tensors.get(name)
    if info is None:
        return graph
    tensors: Mapping[str, TensorInfo] = {**graph.tensors,
                                         name: TensorInfo(onnx.TensorProto.FLOAT, info.dims)}
    return GraphIndex(tensors, graph.constants, graph.dynamic_inputs)


def _require_type(graph: GraphIndex, name: str, role: str, expected: int) -> None:
    info = graph.tensors.get(name)
    if info is None or info.elem_type != expected:
        got = onnx.TensorProto.DataType.Name(info.elem_type) if info else "unknown"
        want = onnx.TensorProto.DataType.Name(expected)
        raise UnmappableNode(f"{role} {name!r} is {got}; int8 kernels take {want}")


def map_matmul_integer(node: onnx.NodeProto, graph: GraphIndex) -> Workload:
    """MatMulInteger (dynamic quantization): u8 activations times a constant s8 matrix ->
    int32, the task ``dense_int8`` with an fp32 output and a unit scale."""
    a, b = node.input[0], node.input[1]
    _require_type(graph, a, "input A", onnx.TensorProto.UINT8)
    _require_type(graph, b, "input B", onnx.TensorProto.INT8)
    if not graph.is_constant(b):
        raise UnmappableNode("MatMulInteger of two activations has no int8 template")
    a_shape, b_shape = graph.static_shape(a, "input A"), graph.static_shape(b, "input B")
    if len(b_shape) != 2 or len(a_shape) < 2 or a_shape[-1] != b_shape[0]:
        raise UnmappableNode(f"MatMulInteger shapes {a_shape} x {b_shape} have no int8 template")
    return make_workload("dense_int8", M=math.prod(a_shape[:-1]), N=b_shape[1], K=b_shape[0],
                         out="f32", scale="tensor")


def map_conv_integer(node: onnx.NodeProto, graph: GraphIndex) -> Workload:
    """ConvInteger (dynamic quantization): the task ``conv2d_int8`` with an fp32 output."""
    from tuner_service.compiler.frontend.conv import map_conv

    data, weight = node.input[0], node.input[1]
    _require_type(graph, data, "input", onnx.TensorProto.UINT8)
    _require_type(graph, weight, "weight", onnx.TensorProto.INT8)
    fp32 = map_conv(node, as_float(graph, data))
    return int8_conv(fp32, out="f32", scale="tensor")
