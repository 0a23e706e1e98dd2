"""Channels-last int8 activations between int8 convolution layers.

An int8 tensor written by a ``conv2d_int8`` layer and read only by ``conv2d_int8`` layers (as
their input or as the shortcut their output stage adds) is kept channels-last (``nhwc``): the
writer stores a register of 16 output channels of one pixel whole, and the readers broadcast a
pixel's four channels as the word they already are, with no stage rewriting the input into
words (``schedule_templates.templates.x86_channels_last``). The layers' workloads say it
(``in_layout``/``out_layout``); every other reader (a pool, a graph output, a numpy step) sees
NCHW as before, since a tensor read by anything else stays NCHW.

A layer that adds a shortcut reads it in its own layout (``residual_layout``), so a residual
chain's last output (read by a pool) stays NCHW while the shortcuts before it do not. The
layers must have one group and output channels in whole registers (16); a layer reads a
channels-last input only with its input channels in whole words (4), so an RGB stem reads its
image NCHW (and may write channels-last).

The same rewrite runs at build time, at load time (the manifest's layout entry says
``"int8": "nhwc"``) and when tasks are extracted for a blocked or automatic layout, so the
workloads tuned, compiled and run are the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import onnx

from schedule_templates.workloads import Conv2dInt8
from tuner_service.compiler.frontend.errors import UnmappableNode
from tuner_service.compiler.frontend.quantized_ops import (
    INT8_DOMAIN,
    INT8_INPUTS,
    INT8_OP,
    int8_layer_workload,
)
from tuner_service.compiler.frontend.shapes import reads

#: the Int8Layer inputs a channels-last tensor may feed
_DATA, _RESIDUAL = INT8_INPUTS.index("data"), INT8_INPUTS.index("residual")


def plan_channels_last(proto: onnx.ModelProto) -> int:
    """Rewrite the workloads of ``proto``'s int8 convolution layers for channels-last
    activations where every reader allows it; returns how many tensors became
    channels-last."""
    eligible = list(_eligible_layers(proto.graph))
    layers = {index: node for index, node, _ in eligible}
    workloads = {index: workload for index, _, workload in eligible}
    if not layers:
        return 0
    readers: dict[str, list[tuple[int, int]]] = {}
    for index, node in enumerate(proto.graph.node):
        for position, name in enumerate(node.input):
            if name:
                readers.setdefault(name, []).append((index, position))
    nested = {name for node in proto.graph.node for attr in node.attribute
              for sub in ([attr.g] if attr.HasField("g") else list(attr.graphs))
              for name in reads(sub)}
    outputs = {value.name for value in proto.graph.output} | nested
    by_output = {node.output[0]: index for index, node in layers.items()}
    chosen = {tensor for tensor in by_output
              if tensor not in outputs and readers.get(tensor)
              and all(reader in layers and (position == _RESIDUAL or (
                  position == _DATA and workloads[reader].C % 4 == 0))
                      for reader, position in readers[tensor])}
    for index, node in layers.items():
        workload = workloads[index]
        shortcut = node.input[_RESIDUAL] if len(node.input) > _RESIDUAL else ""
        laid = dataclasses.replace(
            workload, in_layout="nhwc" if node.input[_DATA] in chosen else "nchw",
            out_layout="nhwc" if node.output[0] in chosen else "nchw",
            residual_layout="nhwc" if shortcut in chosen else "nchw")
        if laid != workload:
            _set_workload(node, laid.key)
    return len(chosen)


def _eligible_layers(graph: onnx.GraphProto
                     ) -> Iterator[tuple[int, onnx.NodeProto, Conv2dInt8]]:
    """(index, node, workload) of each int8 convolution layer that may run channels-last."""
    for index, node in enumerate(graph.node):
        if (node.domain, node.op_type) != (INT8_DOMAIN, INT8_OP):
            continue
        try:
            workload = int8_layer_workload(node)
        except UnmappableNode:
            continue
        if isinstance(workload, Conv2dInt8) and workload.out != "f32" \
                and workload.groups == 1 and workload.K % 16 == 0 \
                and not (workload.weights == "sat16" and workload.group_in % 2):
            yield index, node, workload  # (flat words, an odd sat16 stem's, are NCHW only)


def _set_workload(node: onnx.NodeProto, key: str) -> None:
    for attr in node.attribute:
        if attr.name == "workload":
            attr.s = key.encode()
            return
