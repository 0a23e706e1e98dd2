"""Unary chains between a DequantizeLinear and a QuantizeLinear become 256-entry tables.

``DequantizeLinear(x) -> f1 -> ... -> fn -> QuantizeLinear`` where x is 8-bit, both ends have
per-tensor constant parameters and every ``fi`` is an elementwise function of that one value
(an activation, or arithmetic with constants: BERT's GELU divides by sqrt(2) and takes erf
between a DequantizeLinear and a QuantizeLinear in every layer) maps each of x's 256 possible
values to one output value. The chain becomes one ``tuner.int8`` ``Int8Table`` node: the 8-bit
input and the table, an initializer evaluated here by onnx's reference evaluator on all 256
inputs with the chain's own nodes. At run time that is one byte lookup per element instead of a
dequantization, the fp32 chain and a quantization (three passes over an fp32 tensor).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper

from tuner_service.compiler.frontend.quantized_graph import Group, QuantGraph
from tuner_service.compiler.frontend.quantized_ops import INT8_DOMAIN

logger = logging.getLogger(__name__)

INT8_TABLE = "Int8Table"
#: elementwise operators of one value (their other inputs constant)
UNARY = frozenset({"Abs", "Add", "Sub", "Mul", "Div", "Pow", "Neg", "Exp", "Log", "Sqrt",
                   "Reciprocal", "Erf", "Sigmoid", "Tanh", "Relu", "LeakyRelu", "HardSigmoid",
                   "HardSwish", "Clip", "Gelu", "Softplus", "Elu", "Selu", "Floor", "Ceil",
                   "Round", "Sin", "Cos", "Min", "Max"})
_RANGES: dict[int, tuple[int, int]] = {onnx.TensorProto.UINT8: (0, 255),
                                       onnx.TensorProto.INT8: (-128, 127)}
_DEFAULT = ("", "ai.onnx")


def table_groups(view: QuantGraph, opset: int) -> Iterator[Group]:
    claimed: set[int] = set()
    for position, node in enumerate(view.graph.node):
        if position in claimed or node.domain not in _DEFAULT or node.op_type not in UNARY:
            continue
        group = _table_group(view, position, opset)
        if group is not None and not claimed & group.nodes:
            claimed |= group.nodes
            yield group


def _table_group(view: QuantGraph, position: int, opset: int) -> Group | None:
    first = view.graph.node[position]
    source = _value_input(view, first)
    dq = view.made_by(source, "DequantizeLinear") if source else None
    info = view.info.tensors.get(dq.input[0]) if dq is not None else None
    if dq is None or info is None or info.elem_type not in _RANGES or not _scalars(view, dq):
        return None
    chain, current = [position], first.output[0]
    while True:
        reader = view.only_reader(current)
        if reader is None:
            return None
        node = view.graph.node[reader]
        if node.op_type == "QuantizeLinear" and node.domain in _DEFAULT:
            break
        if (node.domain not in _DEFAULT or node.op_type not in UNARY
                or _value_input(view, node) != current):
            return None
        chain.append(reader)
        current = node.output[0]
    quant = node
    if not _scalars(view, quant):
        return None
    table = _evaluate(view, dq, [view.graph.node[p] for p in chain], quant,
                      info.elem_type, opset)
    if table is None:
        return None
    name = first.name or f"{first.op_type}_{position}"
    table_name = f"{quant.output[0]}.table"
    nodes = {*chain, reader}
    if view.only_reader(dq.output[0]) == position:
        nodes.add(view.producer[dq.output[0]])
    node = onnx.helper.make_node(INT8_TABLE, [dq.input[0], table_name], [quant.output[0]],
                                 name, domain=INT8_DOMAIN)
    return Group(nodes, node, [onnx.numpy_helper.from_array(table, table_name)])


def _value_input(view: QuantGraph, node: onnx.NodeProto) -> str | None:
    """The one input of ``node`` that is not a constant (None if there is not exactly one)."""
    computed = [name for name in node.input if name and view.constant(name) is None]
    return computed[0] if len(computed) == 1 else None


def _scalars(view: QuantGraph, node: onnx.NodeProto) -> bool:
    """A (de)quantization with a constant per-tensor scale (and zero point, if given)."""
    values = [view.constant(name) for name in node.input[1:3] if name]
    return bool(values) and all(v is not None and v.size == 1 for v in values)


def _evaluate(view: QuantGraph, dq: onnx.NodeProto, chain: list[onnx.NodeProto],
              quant: onnx.NodeProto, elem_type: int, opset: int) -> np.ndarray | None:
    """The chain's output for each of the 256 input values, in order from the lowest: the
    ends computed as the runner's numpy steps do (fp32 ``(x - zp) * scale``; ``x / scale``
    rounded half to even, plus the zero point, saturated), the chain by onnx's reference
    evaluator on the 256 dequantized values."""
    from onnx.reference import ReferenceEvaluator

    lo, hi = _RANGES[elem_type]
    scale, zero = (view.constant(name) if name else None for name in
                   (dq.input[1], dq.input[2] if len(dq.input) > 2 else ""))
    assert scale is not None  # _scalars checked it
    x = np.arange(lo, hi + 1).astype(np.float32)
    x -= np.float32(0 if zero is None else zero.reshape(-1)[0])
    x *= np.float32(scale.reshape(-1)[0])
    inner = {out for node in chain for out in node.output}
    constants = {name: view.constant(name) for node in chain for name in node.input
                 if name and name != dq.output[0] and name not in inner}
    if any(value is None for value in constants.values()):
        return None
    graph = onnx.helper.make_graph(
        chain, "table",
        [onnx.helper.make_tensor_value_info(dq.output[0], onnx.TensorProto.FLOAT, [x.size])],
        [onnx.helper.make_tensor_value_info(chain[-1].output[0], onnx.TensorProto.UNDEFINED,
                                            None)],
        [onnx.numpy_helper.from_array(np.asarray(v), n) for n, v in constants.items()])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    try:
        (value,) = ReferenceEvaluator(model).run(None, {dq.output[0]: x})
    except Exception as e:  # onnx's evaluator raises many types: leave the chain as it is
        logger.debug("no table for %s: %s", chain[0].name, e)
        return None
    value = np.asarray(value, np.float32).reshape(-1)
    q_scale, q_zero = (view.constant(name) if name else None for name in
                       (quant.input[1], quant.input[2] if len(quant.input) > 2 else ""))
    assert q_scale is not None
    out_type = np.uint8 if q_zero is None else q_zero.dtype
    if value.size != x.size or out_type not in (np.uint8, np.int8):
        return None
    value = np.rint(value / np.float32(q_scale.reshape(-1)[0]))
    value += np.float32(0 if q_zero is None else q_zero.reshape(-1)[0])
    info = np.iinfo(out_type)
    return np.clip(value, info.min, info.max).astype(out_type)
