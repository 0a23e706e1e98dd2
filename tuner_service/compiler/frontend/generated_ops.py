"""Single ONNX nodes as generated operators: reductions, pooling, softmax, layer norm, concat,
slices (Slice, Split, a Gather of one index) and transposes.

Each mapper turns one node into one layer (Split into one ``Slice`` per output) or raises
``Refused``. The ONNX semantics that differ by opset (Softmax's axis, attributes that became
inputs) are resolved here, so the operators themselves stay opset-free. A mapping is made only
when the memory access it needs is a view the operator has: a softmax or a reduction over a
contiguous block of axes, a 2-D pooling of NCHW data.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import onnx

from tuner_service.compiler.frontend.generated_context import (
    GeneratedLayer,
    PlanContext,
    Refused,
    attr,
    axis_of,
    layer_for,
    make_op,
)

Mapper = Callable[[onnx.NodeProto, int, PlanContext], list[GeneratedLayer]]

_REDUCE = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max"}


def reduce_node(node: onnx.NodeProto, index: int, context: PlanContext
                ) -> list[GeneratedLayer]:
    shape = context.shape(node.input[0])
    axes = context.ints(node, 1, "axes")
    if not axes:
        if attr(node, "noop_with_empty_axes", 0):
            raise Refused("a reduction over no axes (an identity)")
        axes = list(range(len(shape)))
    block = sorted({axis_of(a, len(shape)) for a in axes})
    if block != list(range(block[0], block[0] + len(block))):
        raise Refused(f"reduced axes {block} are not contiguous")
    op = make_op("reduce", mode=_REDUCE[node.op_type], outer=math.prod(shape[:block[0]]),
                 reduced=math.prod(shape[block[0]:block[-1] + 1]),
                 inner=math.prod(shape[block[-1] + 1:]))
    return [layer_for(op, [index], [node.input[0]], node.output[0], context)]


def global_pool(node: onnx.NodeProto, index: int, context: PlanContext
                ) -> list[GeneratedLayer]:
    shape = context.shape(node.input[0])
    if len(shape) < 3:
        raise Refused(f"{node.op_type} of rank {len(shape)}")
    mode = "mean" if node.op_type == "GlobalAveragePool" else "max"
    op = make_op("reduce", mode=mode, outer=shape[0] * shape[1],
                 reduced=math.prod(shape[2:]), inner=1)
    return [layer_for(op, [index], [node.input[0]], node.output[0], context)]


def pool2d(node: onnx.NodeProto, index: int, context: PlanContext) -> list[GeneratedLayer]:
    shape = context.shape(node.input[0])
    op = make_op("pool2d", shape=shape, mode="max" if node.op_type == "MaxPool" else "avg",
                 **pool_window(node, shape),
                 count_include_pad=bool(attr(node, "count_include_pad", 0)))
    return [layer_for(op, [index], [node.input[0]], node.output[0], context)]


def pool_window(node: onnx.NodeProto, shape: tuple[int, ...]) -> dict[str, object]:
    """A 2-D pooling node's window (kernel, stride, pads, dilation, ceil_mode) over an NCHW
    input of ``shape``, else Refused."""
    if len(shape) != 4 or any(node.output[1:]):
        raise Refused(f"{node.op_type} of rank {len(shape)} (or with indices)")
    kernel = [int(k) for k in attr(node, "kernel_shape", [])]
    strides = [int(s) for s in attr(node, "strides", [1, 1])]
    dilation = [int(d) for d in attr(node, "dilations", [1, 1])]
    if len(kernel) != 2 or len(strides) != 2 or len(dilation) != 2:
        raise Refused("a pooling window that is not 2-D")
    pads = _pads(node, shape[2:], kernel, strides, dilation)
    return {"kernel": tuple(kernel), "stride": tuple(strides), "pads": pads,
            "dilation": tuple(dilation), "ceil_mode": bool(attr(node, "ceil_mode", 0))}


def _pads(node: onnx.NodeProto, spatial: tuple[int, ...], kernel: list[int],
          strides: list[int], dilation: list[int]) -> tuple[int, int, int, int]:
    """(top, left, bottom, right), explicit or as ``auto_pad`` SAME_* computes them."""
    auto = attr(node, "auto_pad", "NOTSET")
    if auto in ("NOTSET", "VALID"):
        pads = [int(p) for p in attr(node, "pads", [0, 0, 0, 0])] if auto == "NOTSET" else []
        pads = pads or [0, 0, 0, 0]
        if len(pads) != 4:
            raise Refused(f"pads {pads}")
        return pads[0], pads[1], pads[2], pads[3]
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise Refused(f"auto_pad {auto!r}")
    begin, end = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilation, strict=True):
        total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        small = total // 2
        begin.append(small if auto == "SAME_UPPER" else total - small)
        end.append(total - begin[-1])
    return begin[0], begin[1], end[0], end[1]


def softmax(node: onnx.NodeProto, index: int, context: PlanContext) -> list[GeneratedLayer]:
    shape = context.shape(node.input[0])
    legacy = context.opset < 13  # before 13: the input is flattened to 2-D at ``axis``
    axis = axis_of(int(attr(node, "axis", 1 if legacy else -1)), len(shape))
    if not legacy and math.prod(shape[axis + 1:]) != 1:
        raise Refused(f"softmax over axis {axis} of {shape} is not the contiguous tail")
    kind = "softmax" if node.op_type == "Softmax" else "logsoftmax"
    op = make_op(kind, rows=math.prod(shape[:axis]), cols=math.prod(shape[axis:]))
    return [layer_for(op, [index], [node.input[0]], node.output[0], context)]


def layer_norm(node: onnx.NodeProto, index: int, context: PlanContext
               ) -> list[GeneratedLayer]:
    if any(node.output[1:]):
        raise Refused("LayerNormalization with mean / inverse std outputs")
    shape = context.shape(node.input[0])
    axis = axis_of(int(attr(node, "axis", -1)), len(shape))
    cols = math.prod(shape[axis:])
    params = [n for n in node.input[1:3] if n]
    if len(params) < 1 or any(math.prod(context.shape(p)) != cols for p in params):
        raise Refused("LayerNormalization parameters that broadcast")
    op = make_op("layernorm", rows=math.prod(shape[:axis]), cols=cols,
                 eps=float(attr(node, "epsilon", 1e-5)), scale=True, bias=len(params) == 2)
    return [layer_for(op, [index], [node.input[0], *params], node.output[0], context)]


def concat(node: onnx.NodeProto, index: int, context: PlanContext) -> list[GeneratedLayer]:
    names = [n for n in node.input if n]
    shapes = [context.shape(n) for n in names]
    out = context.shape(node.output[0])
    axis = axis_of(int(attr(node, "axis", 0)), len(out))
    if any(len(s) != len(out) for s in shapes):
        raise Refused("Concat inputs of different ranks")
    widths = tuple(s[axis] * math.prod(s[axis + 1:]) for s in shapes)
    op = make_op("concat", outer=math.prod(out[:axis]), widths=widths)
    return [layer_for(op, [index], names, node.output[0], context)]


def slice_node(node: onnx.NodeProto, index: int, context: PlanContext
               ) -> list[GeneratedLayer]:
    shape = context.shape(node.input[0])
    starts = context.ints(node, 1, "starts")
    ends = context.ints(node, 2, "ends")
    if starts is None or ends is None or len(starts) != len(ends):
        raise Refused("Slice without constant starts and ends")
    axes = context.ints(node, 3, "axes") or list(range(len(starts)))
    steps = context.ints(node, 4, "steps") or [1] * len(starts)
    if not len(axes) == len(steps) == len(starts):
        raise Refused("Slice parameters of different lengths")
    first, step, out = [0] * len(shape), [1] * len(shape), list(shape)
    seen: set[int] = set()
    for begin, end, axis, k in zip(starts, ends, axes, steps, strict=True):
        a = axis_of(axis, len(shape))
        if k <= 0 or a in seen:
            raise Refused(f"Slice step {k} (or axis {a} twice)")
        seen.add(a)
        b, e, _ = slice(begin, end, k).indices(shape[a])
        first[a], step[a], out[a] = b, k, len(range(b, e, k))
    return [_slice_layer(shape, first, step, out, [index], node.input[0], node.output[0],
                         context)]


def split(node: onnx.NodeProto, index: int, context: PlanContext) -> list[GeneratedLayer]:
    shape = context.shape(node.input[0])
    axis = axis_of(int(attr(node, "axis", 0)), len(shape))
    sizes = context.ints(node, 1, "split")
    if not sizes:
        parts, dim = len(node.output), shape[axis]
        if not attr(node, "num_outputs") and dim % parts:
            raise Refused(f"{dim} does not split evenly into {parts}")
        chunk = -(-dim // parts)
        sizes = [chunk] * (parts - 1) + [dim - chunk * (parts - 1)]
    if len(sizes) != len(node.output) or sum(sizes) != shape[axis] or min(sizes) < 1:
        raise Refused(f"split sizes {sizes} of axis {axis} ({shape[axis]})")
    layers, offset = [], 0
    for size, output in zip(sizes, node.output, strict=True):
        first = [offset if a == axis else 0 for a in range(len(shape))]
        out = [size if a == axis else d for a, d in enumerate(shape)]
        if output:
            layers.append(_slice_layer(shape, first, [1] * len(shape), out, [index],
                                       node.input[0], output, context))
        offset += size
    return layers


def gather(node: onnx.NodeProto, index: int, context: PlanContext) -> list[GeneratedLayer]:
    """``x[:, 0]`` (a Gather of one constant index, as ViT's class token is read) is a slice."""
    shape = context.shape(node.input[0])
    picked = context.small(node.input[1])
    axis = axis_of(int(attr(node, "axis", 0)), len(shape))
    if picked.size != 1 or picked.dtype.kind not in "iu":
        raise Refused("a Gather of more than one constant index")
    at = int(picked.reshape(-1)[0])
    if not -shape[axis] <= at < shape[axis]:
        raise Refused(f"Gather index {at} is out of range")
    first = [at % shape[axis] if a == axis else 0 for a in range(len(shape))]
    out = [1 if a == axis else d for a, d in enumerate(shape)]
    return [_slice_layer(shape, first, [1] * len(shape), out, [index], node.input[0],
                         node.output[0], context)]


def _slice_layer(shape: tuple[int, ...], first: list[int], step: list[int], out: list[int],
                 nodes: list[int], source: str, output: str, context: PlanContext
                 ) -> GeneratedLayer:
    if min(out) < 1:
        raise Refused(f"an empty slice {out}")
    op = make_op("slice", shape=shape, starts=tuple(first), steps=tuple(step), out=tuple(out))
    return layer_for(op, nodes, [source], output, context)


def transpose(node: onnx.NodeProto, index: int, context: PlanContext
              ) -> list[GeneratedLayer]:
    shape = context.shape(node.input[0])
    perm = [int(p) for p in attr(node, "perm", list(reversed(range(len(shape)))))]
    op = make_op("transpose", shape=shape, perm=tuple(perm))
    return [layer_for(op, [index], [node.input[0]], node.output[0], context)]


MAPPERS: dict[str, Mapper] = {
    **{op: reduce_node for op in _REDUCE},
    "GlobalAveragePool": global_pool, "GlobalMaxPool": global_pool,
    "MaxPool": pool2d, "AveragePool": pool2d,
    "Softmax": softmax, "LogSoftmax": softmax, "LayerNormalization": layer_norm,
    "Concat": concat, "Slice": slice_node, "Split": split, "Gather": gather,
    "Transpose": transpose,
}
