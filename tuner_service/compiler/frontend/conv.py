"""Map an ONNX ``Conv`` node to a ``conv2d``, ``depthwise_conv2d`` or ``group_conv2d`` workload.

The group count picks the operator: 1 is ``conv2d``, the input channel count is
``depthwise_conv2d``, anything else dividing both channel counts is ``group_conv2d``. A 1-D
convolution (``N, C, L`` input) is the 2-D one over an ``N, C, 1, L`` input: its data, weight
and output are the same memory, so the kernel reads and writes the ONNX tensors as they are.
"""

from __future__ import annotations

import logging
from typing import Any

import onnx

from schedule_templates.workloads import Workload, make_workload
from tuner_service.compiler.frontend.attributes import attr_int, attr_ints, attr_str
from tuner_service.compiler.frontend.errors import UnmappableNode
from tuner_service.compiler.frontend.graph import GraphIndex

logger = logging.getLogger(__name__)


def map_conv(node: onnx.NodeProto, graph: GraphIndex) -> Workload:
    """A 1-D or 2-D convolution in channels-first layout, with any valid group count."""
    data, weight = node.input[0], node.input[1]
    graph.require_float32(data, "input")
    if not graph.is_constant(weight):  # templates pack weights once, outside the timed run
        raise UnmappableNode(f"the weight {weight!r} is computed at run time; convolution "
                             "kernels take constant weights")
    x_shape = graph.static_shape(data, "input")
    w_shape = graph.static_shape(weight, "weight")
    if len(x_shape) not in (3, 4) or len(w_shape) != len(x_shape):
        spatial = len(x_shape) - 2
        raise UnmappableNode(f"{spatial}-D convolution; only 1-D and 2-D Conv have templates")
    one_d = len(x_shape) == 3
    if one_d:  # as 2-D with a height of 1: every per-axis attribute gains a leading unit axis
        x_shape, w_shape = _as_2d(x_shape), _as_2d(w_shape)
    n, c, h, w = x_shape
    k, per_group, r, s = w_shape
    kernel = _spatial(node, "kernel_shape", (r, s), one_d)
    if kernel != (r, s):
        raise UnmappableNode(f"kernel_shape {kernel} does not match the weight shape {w_shape}")
    stride = _spatial(node, "strides", (1, 1), one_d)
    dilation = _spatial(node, "dilations", (1, 1), one_d)
    pad = _pads(node, (h, w), (r, s), stride, dilation, one_d)
    window: dict[str, Any] = {"N": n, "C": c, "H": h, "W": w, "R": r, "S": s}
    window.update(stride=stride, pad=pad, dilation=dilation)
    group = _group(node, c, k, per_group)
    if group == 1:
        return make_workload("conv2d", K=k, **window)
    if group == c:
        return make_workload("depthwise_conv2d", multiplier=k // group, **window)
    return make_workload("group_conv2d", K=k, groups=group, **window)


def _as_2d(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    return shape[0], shape[1], 1, shape[2]


def _group(node: onnx.NodeProto, channels: int, out_channels: int, per_group: int) -> int:
    """The node's group count, checked against both channel counts and the weight."""
    group = attr_int(node, "group", 1)
    if group < 1 or channels % group or out_channels % group:
        raise UnmappableNode(f"group={group} does not divide the input channels ({channels}) "
                             f"and the output channels ({out_channels})")
    if per_group != channels // group:
        raise UnmappableNode(f"the weight has {per_group} input channels per group; group="
                             f"{group} of {channels} channels needs {channels // group}")
    return group


def _spatial(node: onnx.NodeProto, name: str, default: tuple[int, int], one_d: bool
             ) -> tuple[int, int]:
    """A per-axis attribute as (height, width); a 1-D node's single value is the width (its
    height, of extent 1, has kernel, stride and dilation 1)."""
    value = attr_ints(node, name, default[1:] if one_d else default)
    if len(value) != (1 if one_d else 2):
        raise UnmappableNode(f"{name}={list(value)} is not {1 if one_d else 2} value(s)")
    return (1, value[0]) if one_d else (value[0], value[1])


def _pads(
    node: onnx.NodeProto,
    size: tuple[int, int],
    kernel: tuple[int, int],
    stride: tuple[int, int],
    dilation: tuple[int, int],
    one_d: bool = False,
) -> tuple[int, int, int, int]:
    """Explicit (top, left, bottom, right) padding; ONNX ``pads`` has the same order (a 1-D
    node's ``[begin, end]`` pads the width)."""
    mode = attr_str(node, "auto_pad", "NOTSET")
    if mode == "NOTSET":
        pads = attr_ints(node, "pads", (0, 0) if one_d else (0, 0, 0, 0))
        if len(pads) != (2 if one_d else 4):
            raise UnmappableNode(f"pads={list(pads)} is not {2 if one_d else 4} values")
        return (0, pads[0], 0, pads[1]) if one_d else (pads[0], pads[1], pads[2], pads[3])
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
