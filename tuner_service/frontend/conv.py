"""Map an ONNX ``Conv`` node to a ``conv2d`` or ``depthwise_conv2d`` workload."""

from __future__ import annotations

import logging
from typing import Any

import onnx

from schedule_templates.workloads import Workload, make_workload
from tuner_service.frontend.attributes import attr_int, attr_ints, attr_str
from tuner_service.frontend.errors import UnmappableNode
from tuner_service.frontend.graph import GraphIndex

logger = logging.getLogger(__name__)


def map_conv(node: onnx.NodeProto, graph: GraphIndex) -> Workload:
    """A 2-D NCHW convolution; groups other than 1 and C have no template and are refused."""
    data, weight = node.input[0], node.input[1]
    graph.require_float32(data, "input")
    x_shape = graph.static_shape(data, "input")
    w_shape = graph.static_shape(weight, "weight")
    if len(x_shape) != 4 or len(w_shape) != 4:
        spatial = len(x_shape) - 2
        raise UnmappableNode(f"{spatial}-D convolution; only 2-D (NCHW) Conv has a template")
    n, c, h, w = x_shape
    k, _, r, s = w_shape
    kernel = attr_ints(node, "kernel_shape", (r, s))
    if kernel != (r, s):
        raise UnmappableNode(f"kernel_shape {kernel} does not match the weight shape {w_shape}")
    stride = _pair(node, "strides")
    dilation = _pair(node, "dilations")
    pad = _pads(node, (h, w), (r, s), stride, dilation)
    window: dict[str, Any] = {"N": n, "C": c, "H": h, "W": w, "R": r, "S": s}
    window.update(stride=stride, pad=pad, dilation=dilation)
    group = attr_int(node, "group", 1)
    if group == 1:
        return make_workload("conv2d", K=k, **window)
    if group == c and k % group == 0:
        return make_workload("depthwise_conv2d", multiplier=k // group, **window)
    raise UnmappableNode(
        f"grouped convolution with group={group} (input channels {c}); only group=1 and "
        "depthwise (group = input channels) have templates"
    )


def _pair(node: onnx.NodeProto, name: str) -> tuple[int, int]:
    value = attr_ints(node, name, (1, 1))
    if len(value) != 2:
        raise UnmappableNode(f"{name}={list(value)} is not two values")
    return value[0], value[1]


def _pads(
    node: onnx.NodeProto,
    size: tuple[int, int],
    kernel: tuple[int, int],
    stride: tuple[int, int],
    dilation: tuple[int, int],
) -> tuple[int, int, int, int]:
    """Explicit (top, left, bottom, right) padding; ONNX ``pads`` has the same order."""
    mode = attr_str(node, "auto_pad", "NOTSET")
    if mode == "NOTSET":
        pads = attr_ints(node, "pads", (0, 0, 0, 0))
        if len(pads) != 4:
            raise UnmappableNode(f"pads={list(pads)} is not four values")
        return pads[0], pads[1], pads[2], pads[3]
    if mode == "VALID":
        return 0, 0, 0, 0
    if mode not in ("SAME_UPPER", "SAME_LOWER"):
        raise UnmappableNode(f"unknown auto_pad {mode!r}")
    height = _same_padding(size[0], kernel[0], stride[0], dilation[0], mode == "SAME_UPPER")
    width = _same_padding(size[1], kernel[1], stride[1], dilation[1], mode == "SAME_UPPER")
    return height[0], width[0], height[1], width[1]


def _same_padding(
    size: int, kernel: int, stride: int, dilation: int, extra_at_end: bool
) -> tuple[int, int]:
    """(begin, end) padding so the output has ceil(size / stride) elements, as ONNX defines
    SAME_*: the odd element goes at the end for SAME_UPPER and at the start for SAME_LOWER."""
    if stride < 1:
        raise UnmappableNode(f"stride {stride} must be positive")
    out = -(-size // stride)
    total = max(0, (out - 1) * stride + dilation * (kernel - 1) + 1 - size)
    small, large = total // 2, total - total // 2
    return (small, large) if extra_at_end else (large, small)
