"""A quantized addition or product with a constant scalar is a table of its other operand.

``Int8Add(x, c)`` and ``Int8Mul(x, c)`` (``quantized_glue``) with ``c`` one constant 8-bit
value (an initializer, a Constant node, or the QuantizeLinear of either: BERT's GELU adds 1 and
halves, its attention scales its scores, each between a DequantizeLinear and a QuantizeLinear)
map each of x's 256 values to one output byte, so they become ``Int8Table`` nodes: the table is
the glue operator's own reference (``schedule_templates.ops.quant.QuantizedBinary``: the same
fp32 operations in the same order as the kernel and the numpy step) on all 256 inputs, so the
bytes do not change. A table whose 8-bit input is another table's output, read by nothing else,
is composed with it (``outer[inner[x]]``): GELU's ``erf(x / sqrt 2) + 1`` is one lookup, one
pass over the activation instead of two.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper

from schedule_templates.ops.quant import Quantize, QuantizedBinary
from tuner_service.compiler.frontend.quantized_glue import INT8_ADD, INT8_MUL
from tuner_service.compiler.frontend.quantized_graph import Group, QuantGraph
from tuner_service.compiler.frontend.quantized_ops import INT8_DOMAIN
from tuner_service.compiler.frontend.quantized_table import INT8_TABLE

_TYPES: dict[int, str] = {onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.INT8: "int8"}
_LOW = {"uint8": 0, "int8": -128}
_NUMPY = {"uint8": np.uint8, "int8": np.int8}


def scalar_tables(view: QuantGraph) -> Iterator[Group]:
    """One group per Int8Add / Int8Mul with a constant scalar operand (its table)."""
    for position, node in enumerate(view.graph.node):
        if node.domain == INT8_DOMAIN and node.op_type in (INT8_ADD, INT8_MUL):
            group = _as_table(view, position, node)
            if group is not None:
                yield group


def composed_tables(view: QuantGraph) -> Iterator[Group]:
    """One group per Int8Table reading another Int8Table's output that nothing else reads."""
    claimed: set[int] = set()
    for position, node in enumerate(view.graph.node):
        if not _is_table(node) or position in claimed:
            continue
        inner_at = view.producer.get(node.input[0])
        if inner_at is None or inner_at in claimed or view.only_reader(node.input[0]) != position:
            continue
        inner = view.graph.node[inner_at]
        if not _is_table(inner):  # any producer (one of a single input, say): nothing to compose
            continue
        outer_table, inner_table = view.constant(node.input[1]), view.constant(inner.input[1])
        if outer_table is None or inner_table is None:
            continue
        low = -128 if inner_table.dtype == np.int8 else 0
        table = outer_table[inner_table.astype(np.int16) - low]
        name = f"{node.output[0]}.composed"
        claimed |= {position, inner_at}
        yield Group({inner_at, position},
                    onnx.helper.make_node(INT8_TABLE, [inner.input[0], name], [node.output[0]],
                                          node.name, domain=INT8_DOMAIN),
                    [onnx.numpy_helper.from_array(table, name)])


def _is_table(node: onnx.NodeProto) -> bool:
    return node.domain == INT8_DOMAIN and node.op_type == INT8_TABLE


def _as_table(view: QuantGraph, position: int, node: onnx.NodeProto) -> Group | None:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    operation = "mul" if node.op_type == INT8_MUL else "add"
    for scalar_at in (1, 0):
        value = _scalar_byte(view, node.input[scalar_at])
        operand = node.input[1 - scalar_at]
        info = view.info.tensors.get(operand)
        if value is None or info is None or info.elem_type not in _TYPES:
            continue
        table = _table(attrs, operation, _TYPES[info.elem_type], value, scalar_at)
        if table is None:
            continue
        name = f"{node.output[0]}.table"
        return Group({position}, onnx.helper.make_node(
            INT8_TABLE, [operand, name], [node.output[0]], node.name, domain=INT8_DOMAIN),
            [onnx.numpy_helper.from_array(table, name)])
    return None


def _scalar_byte(view: QuantGraph, name: str) -> np.ndarray | None:
    """The 8-bit value of a one-element constant, or of the QuantizeLinear of one (computed as
    the runner folds it: ``Quantize``'s reference)."""
    value = view.constant(name)
    if value is None:
        quant = view.made_by(name, "QuantizeLinear")
        if quant is None or len(quant.input) < 3:
            return None
        source, scale, zero = (view.constant(n) for n in quant.input[:3])
        if source is None or scale is None or zero is None or source.size != 1 \
                or scale.size != 1 or zero.size != 1 or zero.dtype not in (np.uint8, np.int8):
            return None
        out = "uint8" if zero.dtype == np.uint8 else "int8"
        value = Quantize(1, float(scale.reshape(-1)[0]), int(zero.reshape(-1)[0]),
                         out).reference({"x": source.astype(np.float32)})
    if value.size != 1 or value.dtype not in (np.uint8, np.int8):
        return None
    return value.reshape(1)


def _table(attrs: dict[str, Any], operation: str, dtype: str, scalar: np.ndarray,
           scalar_at: int) -> np.ndarray | None:
    """The operator's output for each of the operand's 256 values (the scalar broadcast)."""
    values = np.arange(_LOW[dtype], _LOW[dtype] + 256).astype(_NUMPY[dtype])
    scalar_dtype = "uint8" if scalar.dtype == np.uint8 else "int8"
    a_dtype, b_dtype = (dtype, scalar_dtype) if scalar_at == 1 else (scalar_dtype, dtype)
    out = attrs.get("out", b"u8")
    try:
        op = QuantizedBinary(
            256, a_dtype, float(attrs["a_scale"]), int(attrs["a_zero_point"]),
            b_dtype, float(attrs["b_scale"]), int(attrs["b_zero_point"]),
            "uint8" if out in (b"u8", "u8") else "int8", float(attrs["y_scale"]),
            int(attrs["y_zero_point"]), bool(attrs.get("relu", 0)),
            "b" if scalar_at == 1 else "a", 1, operation)
    except (KeyError, TypeError, ValueError):  # malformed attributes: leave the node as it is
        return None
    inputs = {"a": values, "b": scalar} if scalar_at == 1 else {"a": scalar, "b": values}
    return np.asarray(op.reference(inputs))
