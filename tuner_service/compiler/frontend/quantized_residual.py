"""A quantized shortcut addition fused into the int8 convolution before it.

A QDQ residual block ends in ``DequantizeLinear`` x2 -> ``Add`` -> ``QuantizeLinear`` over the
last convolution's 8-bit output and the shortcut; after the layer and glue rewrites
(``quantized``, ``quantized_glue``) that is an ``Int8Layer`` (``conv2d_int8``) whose output only
an ``Int8Add`` reads. Run apart, the addition is one more kernel and one more pass over the
block's output (ResNet-50 int8: 16 of them, 0.8 ms of 23 at one thread on an AMD Zen 4). This
rewrite folds it into the layer (``conv2d_int8`` with ``residual=u8|s8``): the output stage
requantizes to the 8-bit value as before, then adds the shortcut's element in onnxruntime's
arithmetic (``quant_add.FusedAdd``, what the ``Int8Add`` kernel computes for an addition of one
shape without a Relu), so the bytes are those of the two steps.

Left as they are: an addition with a Relu or of two shapes (it keeps the unfused arithmetic),
a product, one whose first operand is not the layer's output (the two FMAs' order is part of
the rounding), a shortcut of another 8-bit type than the sum, a layer that something else
reads too, with a ReLU, an fp32 output, a fused addition already, or depthwise.
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
from schedule_templates.quant_add import FusedAdd
from schedule_templates.workloads import Conv2dInt8
from tuner_service.compiler.frontend.errors import UnmappableNode
from tuner_service.compiler.frontend.quantized_glue import folded_additions
from tuner_service.compiler.frontend.quantized_graph import Group, QuantGraph
from tuner_service.compiler.frontend.quantized_ops import INT8_INPUTS, plain_int8_layer

_TYPES = {"u8": onnx.TensorProto.UINT8, "s8": onnx.TensorProto.INT8}


def fused_residual_adds(view: QuantGraph) -> Iterator[Group]:
    """One group per ``Int8Add`` whose first operand is a plain ``conv2d_int8`` layer's
    output that only it reads: the layer with the addition fused, in the addition's place."""
    return folded_additions(view, _fused)


def _fused(view: QuantGraph, position: int, add: onnx.NodeProto, attrs: dict[str, Any]
           ) -> Group | None:
    operand, shortcut = add.input
    layer_at = view.producer.get(operand)
    if layer_at is None or view.only_reader(operand) != position or shortcut == operand:
        return None
    layer = view.graph.node[layer_at]
    workload = _plain_conv(layer)
    out = attrs.get("out", b"u8")
    out = out.decode() if isinstance(out, bytes) else str(out)
    if workload is None or out not in _TYPES or not _is_shortcut(view, layer, shortcut, out):
        return None
    try:
        fused = dataclasses.replace(workload, residual=out)
        numbers = FusedAdd.of(float(attrs["a_scale"]), int(attrs["a_zero_point"]),
                              float(attrs["b_scale"]), int(attrs["b_zero_point"]),
                              float(attrs["y_scale"]), int(attrs["y_zero_point"]))
    except (ScheduleError, KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    constants = np.array([numbers.ratio_a, numbers.ratio_b, numbers.constant], np.float32)
    if not np.isfinite(constants).all():
        return None
    prefix = f"{layer.name}.int8"
    node = onnx.NodeProto()
    node.CopyFrom(layer)
    del node.input[:]
    inputs = [*layer.input, *[""] * (INT8_INPUTS.index("residual") - len(layer.input))]
    node.input.extend([*inputs, shortcut, f"{prefix}.residual_add"])
    node.output[0] = add.output[0]
    for attr in node.attribute:
        if attr.name == "workload":
            attr.s = fused.key.encode()
    initializer = onnx.numpy_helper.from_array(constants, f"{prefix}.residual_add")
    return Group({layer_at, position}, node, [initializer])


def _plain_conv(layer: onnx.NodeProto) -> Conv2dInt8 | None:
    """The layer's workload when it is a ``conv2d_int8`` with an 8-bit output, no ReLU, no
    fused addition and not depthwise."""
    workload = plain_int8_layer(layer)
    if not isinstance(workload, Conv2dInt8) or workload.residual != "none" \
            or workload.groups == workload.C > 1:
        return None
    return workload


def _is_shortcut(view: QuantGraph, layer: onnx.NodeProto, shortcut: str, out: str) -> bool:
    """The shortcut is an activation of the sum's 8-bit type and of the layer's shape."""
    info = view.info.tensors.get(shortcut)
    shape = next((list(a.ints) for a in layer.attribute if a.name == "shape"), None)
    if info is None or info.elem_type != _TYPES[out] or shape is None \
            or view.constant(shortcut) is not None:
        return False
    try:
        return list(view.info.static_shape(shortcut, "shortcut")) == shape
    except UnmappableNode:
        return False
