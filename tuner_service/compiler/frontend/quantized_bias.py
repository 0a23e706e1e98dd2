"""A quantized bias addition fused into the int8 matrix product before it.

An exporter writes a linear layer as ``MatMul`` then ``Add(bias)``, and ``quantize_static``
quantizes the two apart: the product's u8 output, then ``DequantizeLinear`` x2 -> ``Add`` ->
``QuantizeLinear`` with the bias as an 8-bit constant. After the layer and glue rewrites
(``quantized``, ``quantized_glue``) that is an ``Int8Layer`` (``dense_int8``) whose output only
an ``Int8Add`` with a constant reads: in QDQ BERT-base 72 of them, each one more pass over the
activation per run. This rewrite folds the addition into the layer (``dense_int8`` with
``add=u8|s8``): the kernel's output stage requantizes to the 8-bit value as before, then does
the addition's own dequantize-add-quantize in registers, in the same fp32 operations, so the
bytes are those of the two steps.

The constant (a vector of the output's columns, or a scalar) is dequantized here, once, as the
glue computes it: ``(float(b) - zero_point) * scale`` in fp32. Left as they are: an addition
with a Relu, a product (``Int8Mul``), a layer whose output something else reads too, a layer
with a ReLU or an fp32 output, a constant that broadcasts any other way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper

from schedule_templates.errors import ScheduleError
from schedule_templates.ops.quant import Quantize
from schedule_templates.workloads import DenseInt8
from tuner_service.compiler.frontend.errors import UnmappableNode
from tuner_service.compiler.frontend.quantized_glue import folded_additions
from tuner_service.compiler.frontend.quantized_graph import Group, QuantGraph
from tuner_service.compiler.frontend.quantized_ops import plain_int8_layer

_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))


def fused_bias_adds(view: QuantGraph) -> Iterator[Group]:
    """One group per ``Int8Add`` of a constant to a ``dense_int8`` layer's 8-bit output that
    only it reads: the layer with the addition fused, in the addition's place."""
    return folded_additions(view, _fused)


def _fused(view: QuantGraph, position: int, add: onnx.NodeProto, attrs: dict[str, Any]
           ) -> Group | None:
    for side, other in (("a", "b"), ("b", "a")):
        operand = add.input[0 if side == "a" else 1]
        layer_at = view.producer.get(operand)
        if layer_at is None or view.only_reader(operand) != position:
            continue
        layer = view.graph.node[layer_at]
        workload = _plain_dense(layer)
        if workload is None:
            continue
        constant, absorbed = _byte_constant(view, add.input[1 if side == "a" else 0], position)
        addend = _addend(constant, attrs, other, workload.N)
        if addend is None or not _same_shape(view, layer, add.output[0]):
            continue
        out = attrs.get("out", b"u8")
        try:
            fused = dataclasses.replace(
                workload, add=out.decode() if isinstance(out, bytes) else str(out))
        except ScheduleError:
            continue
        node, initializers = _fused_node(layer, fused, add.output[0], {
            "add_value": addend,
            "add_scale": np.array([attrs[f"{side}_scale"], attrs["y_scale"]], np.float32),
            "add_zero_point": np.array([attrs[f"{side}_zero_point"], attrs["y_zero_point"]],
                                       np.int32)})
        return Group({layer_at, position, *absorbed}, node, initializers)
    return None


def _fused_node(layer: onnx.NodeProto, fused: DenseInt8, output: str,
                arrays: dict[str, np.ndarray]) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    """The layer with the addition's inputs after its own six (``INT8_INPUTS``: the omitted
    ones empty), the fused workload and the addition's output."""
    prefix = f"{layer.name}.int8"
    node = onnx.NodeProto()
    node.CopyFrom(layer)
    del node.input[:]
    node.input.extend([*layer.input, *[""] * (6 - len(layer.input)),
                       *(f"{prefix}.{name}" for name in arrays)])
    node.output[0] = output
    for attr in node.attribute:
        if attr.name == "workload":
            attr.s = fused.key.encode()
    return node, [onnx.numpy_helper.from_array(v, f"{prefix}.{k}") for k, v in arrays.items()]


def _plain_dense(layer: onnx.NodeProto) -> DenseInt8 | None:
    """The layer's workload when it is a ``dense_int8`` with an 8-bit output, no ReLU and no
    addition fused yet."""
    workload = plain_int8_layer(layer)
    return workload if isinstance(workload, DenseInt8) and workload.add == "none" else None


def _byte_constant(view: QuantGraph, name: str, reader: int
                   ) -> tuple[np.ndarray | None, set[int]]:
    """(the 8-bit value of a constant, or of the QuantizeLinear of an fp32 one, computed as
    the runner folds it; the positions of nodes only the addition read that made it)."""
    value = view.constant(name)
    if value is not None:
        return value, set()
    quant = view.made_by(name, "QuantizeLinear")
    if quant is None or len(quant.input) < 3:
        return None, set()
    source, scale, zero = (view.constant(n) for n in quant.input[:3])
    if source is None or scale is None or zero is None or scale.size != 1 \
            or zero.size != 1 or zero.dtype not in _EIGHT_BIT or source.size == 0:
        return None, set()
    try:
        op = Quantize(int(source.size), float(scale.reshape(-1)[0]),
                      int(zero.reshape(-1)[0]), str(zero.dtype))
    except ScheduleError:
        return None, set()
    value = op.reference({"x": source.astype(np.float32)}).reshape(source.shape)
    mine = {view.producer[name]} if view.only_reader(name) == reader else set()
    return value, mine


def _addend(constant: np.ndarray | None, attrs: dict[str, object], side: str, columns: int
            ) -> np.ndarray | None:
    """The constant dequantized in fp32 as the glue does it, one value per output column;
    None unless it is 8-bit and one value or one per column (leading ones aside)."""
    if constant is None or constant.dtype not in _EIGHT_BIT:
        return None
    dims = list(constant.shape)
    while dims and dims[0] == 1:
        dims.pop(0)
    if dims not in ([], [columns]):
        return None
    try:
        zero_point = np.float32(int(attrs[f"{side}_zero_point"]))  # type: ignore[call-overload]
        scale = np.float32(float(attrs[f"{side}_scale"]))  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError):
        return None
    value = constant.reshape(-1).astype(np.float32)
    value -= zero_point
    value *= scale
    return np.ascontiguousarray(np.broadcast_to(value, (columns,)), dtype=np.float32)


def _same_shape(view: QuantGraph, layer: onnx.NodeProto, output: str) -> bool:
    """The addition's output has the layer's shape (the constant broadcast adds no axis)."""
    shape = next((list(a.ints) for a in layer.attribute if a.name == "shape"), None)
    try:
        return shape is not None and list(view.info.static_shape(output, "output")) == shape
    except UnmappableNode:
        return False

