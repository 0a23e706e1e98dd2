"""Quantized residual additions: ``DequantizeLinear(a) + DequantizeLinear(b) [-> Relu] ->
QuantizeLinear`` (what ``quantize_static`` writes for a ResNet block's shortcut, and what
onnxruntime fuses into QLinearAdd) becomes one ``tuner.int8`` ``Int8Add`` node reading the two
8-bit tensors: one pass instead of two dequantizations, an fp32 add and a quantization. A
product (``Mul``: BERT's GELU multiplies ``x`` by ``1 + erf(x / sqrt 2)``, then by 0.5) becomes
an ``Int8Mul`` the same way.

Its numpy step (``deploy.ops_quant``) computes exactly what the unfused nodes compute: each
operand dequantized in fp32, the sum (ReLU'd), divided by the output scale, rounded half to
even, shifted by the zero point and saturated.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import onnx
import onnx.helper

from tuner_service.compiler.frontend.errors import UnmappableNode
from tuner_service.compiler.frontend.quantized_graph import Group, QuantGraph, scalar_constant
from tuner_service.compiler.frontend.quantized_ops import INT8_DOMAIN

logger = logging.getLogger(__name__)

INT8_ADD = "Int8Add"
INT8_MUL = "Int8Mul"
#: the standard operator each quantized binary node replaces
BINARY = {"Add": INT8_ADD, "Mul": INT8_MUL}
_EIGHT_BIT = (onnx.TensorProto.UINT8, onnx.TensorProto.INT8)


#: a rewrite that folds one plain addition into the layer before it: (view, the addition's
#: position, the node, its attributes) -> the group that replaces both, or None
Fold = Callable[[QuantGraph, int, onnx.NodeProto, dict[str, Any]], Group | None]


def folded_additions(view: QuantGraph, fold: Fold) -> Iterator[Group]:
    """``fold`` applied to every ``Int8Add`` of two operands without a Relu (the additions a
    layer before them may take into its output stage): the groups it makes."""
    for position, node in enumerate(view.graph.node):
        if node.domain == INT8_DOMAIN and node.op_type == INT8_ADD and len(node.input) == 2:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            group = None if attrs.get("relu", 0) else fold(view, position, node, attrs)
            if group is not None:
                yield group


def int8_add_groups(view: QuantGraph) -> Iterator[Group]:
    claimed: set[int] = set()
    for position, node in enumerate(view.graph.node):
        if (node.op_type not in BINARY or node.domain not in ("", "ai.onnx")
                or position in claimed):
            continue
        try:
            group = _add_group(view, position)
        except UnmappableNode as e:
            logger.debug("%s %s stays fp32: %s", node.op_type, node.name or position, e)
            continue
        if group is not None and not claimed & group.nodes:
            claimed |= group.nodes
            yield group


def _operand(view: QuantGraph, name: str, node: str) -> tuple[str, float, int, int] | None:
    """(8-bit tensor, scale, zero point, position of its DequantizeLinear) behind ``name``."""
    dq = view.made_by(name, "DequantizeLinear")
    if dq is None:
        return None
    info = view.info.tensors.get(dq.input[0])
    if info is None or info.elem_type not in _EIGHT_BIT:
        return None
    scale = scalar_constant(view, dq.input[1], "scale", node)
    zp = (scalar_constant(view, dq.input[2], "zero point", node)
          if len(dq.input) > 2 and dq.input[2] else np.zeros(1, np.uint8))
    return dq.input[0], float(scale[0]), int(zp[0]), view.producer[name]


def _add_group(view: QuantGraph, position: int) -> Group | None:
    add = view.graph.node[position]
    name = add.name or f"{add.op_type}_{position}"
    if len(add.input) != 2:
        return None
    a = _operand(view, add.input[0], name)
    b = _operand(view, add.input[1], name)
    if a is None or b is None:
        return None
    nodes = {position}
    nodes |= {operand[3] for operand, tensor in ((a, add.input[0]), (b, add.input[1]))
              if view.only_reader(tensor) == position}
    output, relu = add.output[0], False
    nxt = view.only_reader(output)
    if nxt is not None and view.graph.node[nxt].op_type == "Relu":
        relu, output = True, view.graph.node[nxt].output[0]
        nodes.add(nxt)
        nxt = view.only_reader(output)
    quant = view.graph.node[nxt] if nxt is not None else None
    if quant is None or quant.op_type != "QuantizeLinear":
        return None
    y_scale = scalar_constant(view, quant.input[1], "output scale", name)
    y_zp = (scalar_constant(view, quant.input[2], "output zero point", name)
            if len(quant.input) > 2 and quant.input[2] else np.zeros(1, np.uint8))
    if y_zp.dtype not in (np.uint8, np.int8):
        return None
    nodes.add(nxt)  # type: ignore[arg-type]
    node = onnx.helper.make_node(
        BINARY[add.op_type], [a[0], b[0]], [quant.output[0]], name, domain=INT8_DOMAIN,
        a_scale=a[1], a_zero_point=a[2], b_scale=b[1], b_zero_point=b[2],
        y_scale=float(y_scale[0]), y_zero_point=int(y_zp[0]),
        out="u8" if y_zp.dtype == np.uint8 else "s8", relu=int(relu))
    return Group(nodes, node, [])


# data movement that onnxruntime runs on the 8-bit tensor itself (QDQ propagation), and the
# max pooling, which commutes with the monotone dequantization (ResNet's stem pool)
_MOVES = ("Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "MaxPool")


def requantize_free_moves(view: QuantGraph) -> Iterator[Group]:
    """``DequantizeLinear -> Reshape|Transpose|... -> QuantizeLinear`` with equal scale and zero
    point: the move on the 8-bit tensor itself (dequantizing and quantizing again with the same
    parameters gives back every 8-bit value exactly)."""
    for position, node in enumerate(view.graph.node):
        if node.op_type not in _MOVES or node.domain not in ("", "ai.onnx") or any(
                node.output[1:]):  # a MaxPool's Indices: not a move of the values
            continue
        dq = view.made_by(node.input[0], "DequantizeLinear")
        nxt = view.only_reader(node.output[0])
        if dq is None or nxt is None or view.only_reader(node.input[0]) != position:
            continue
        quant = view.graph.node[nxt]
        if quant.op_type != "QuantizeLinear" or not _same_parameters(view, dq, quant):
            continue
        info = view.info.tensors.get(dq.input[0])
        if info is None or info.elem_type not in _EIGHT_BIT:
            continue
        moved = onnx.NodeProto()
        moved.CopyFrom(node)
        moved.input[0] = dq.input[0]
        moved.output[0] = quant.output[0]
        yield Group({view.producer[node.input[0]], position, nxt}, moved, [])


def _same_parameters(view: QuantGraph, dq: onnx.NodeProto, quant: onnx.NodeProto) -> bool:
    for index in (1, 2):
        a = view.constant(dq.input[index]) if len(dq.input) > index else None
        b = view.constant(quant.input[index]) if len(quant.input) > index else None
        if a is None or b is None or a.dtype != b.dtype or a.size != 1 or b.size != 1 or (
                a.reshape(-1)[0] != b.reshape(-1)[0]):
            return False
    return True
