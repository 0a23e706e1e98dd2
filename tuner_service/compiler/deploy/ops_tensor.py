"""numpy implementations of element-wise and shape operators (ONNX semantics, opset 11-21).

Each returns new arrays (or views) and never writes into its inputs: tensors produced by
kernels live in buffers the runner reuses on every call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx.helper

from tuner_service.compiler.deploy.node import Array, NodeInfo, OpFn, ints, optional, required


def _binary(fn: Callable[[Array, Array], Array]) -> OpFn:
    def run(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
        return [np.asarray(fn(required(inputs, 0, node), required(inputs, 1, node)))]
    return run


def _variadic(fn: Callable[[Array, Array], Array]) -> OpFn:
    def run(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
        arrays = [x for x in inputs if x is not None]
        out = arrays[0]
        for x in arrays[1:]:
            out = fn(out, x)
        return [np.asarray(out)]
    return run


def _unary(fn: Callable[[Array], Array]) -> OpFn:
    def run(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
        return [np.asarray(fn(required(inputs, 0, node)))]
    return run


def _div(a: Array, b: Array) -> Array:
    if np.issubdtype(a.dtype, np.integer):  # ONNX integer division truncates toward zero
        return np.trunc(a / b).astype(a.dtype)
    return np.asarray(a / b)


def erf(x: Array) -> Array:
    """Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7), vectorized in fp32."""
    x = np.asarray(x, dtype=np.float32)
    a = np.abs(x)
    t = np.float32(1.0) / (np.float32(1.0) + np.float32(0.3275911) * a)
    poly = t * (np.float32(0.254829592) + t * (np.float32(-0.284496736) + t * (
        np.float32(1.421413741) + t * (np.float32(-1.453152027) + t * np.float32(1.061405429)))))
    return np.asarray(np.copysign(np.float32(1.0) - poly * np.exp(-a * a), x), dtype=x.dtype)


def _clip(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x = required(inputs, 0, node)
    low, high = optional(inputs, 1), optional(inputs, 2)
    if node.opset < 11:
        low, high = node.get("min"), node.get("max")
    out = x
    if low is not None:
        out = np.maximum(out, np.asarray(low, dtype=x.dtype))
    if high is not None:
        out = np.minimum(out, np.asarray(high, dtype=x.dtype))
    return [out]


def _leaky_relu(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x = required(inputs, 0, node)
    return [np.where(x >= 0, x, x * np.float32(node.get("alpha", 0.01)))]


def _hard_sigmoid(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x = required(inputs, 0, node)
    alpha, beta = np.float32(node.get("alpha", 0.2)), np.float32(node.get("beta", 0.5))
    return [np.clip(x * alpha + beta, 0, 1).astype(x.dtype)]


def _hard_swish(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x = required(inputs, 0, node)
    return [x * np.clip(x / np.float32(6) + np.float32(0.5), 0, 1).astype(x.dtype)]


def _gelu(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x = required(inputs, 0, node)
    if node.get("approximate", "none") == "tanh":
        inner = np.float32(np.sqrt(2 / np.pi)) * (x + np.float32(0.044715) * x * x * x)
        return [np.float32(0.5) * x * (np.float32(1) + np.tanh(inner))]
    return [np.float32(0.5) * x * (np.float32(1) + erf(x * np.float32(1 / np.sqrt(2))))]


def _sigmoid(x: Array) -> Array:
    return np.asarray(np.float32(1) / (np.float32(1) + np.exp(-x)), dtype=x.dtype)


def _cast(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    dtype = onnx.helper.tensor_dtype_to_np_dtype(int(node.get("to")))
    return [required(inputs, 0, node).astype(dtype)]


def _where(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    c, a, b = (required(inputs, i, node) for i in range(3))
    return [np.where(c, a, b)]


# -- shapes --------------------------------------------------------------------------------


def _shape(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    shape = required(inputs, 0, node).shape
    start, end = node.get("start", 0), node.get("end", len(shape))
    return [np.asarray(shape[start:end], dtype=np.int64)]


def _reshape(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x = required(inputs, 0, node)
    shape = ints(required(inputs, 1, node))
    if not node.get("allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [x.reshape(shape)]


def _flatten(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x = required(inputs, 0, node)
    axis = node.get("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    lead = int(np.prod(x.shape[:axis], dtype=np.int64))
    return [x.reshape(lead, -1)]


def _transpose(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x = required(inputs, 0, node)
    return [np.transpose(x, node.get("perm"))]


def _concat(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    return [np.concatenate([x for x in inputs if x is not None], axis=node.get("axis"))]


def _split(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x = required(inputs, 0, node)
    axis = node.get("axis", 0)
    sizes = ints(optional(inputs, 1)) if node.opset >= 13 else list(node.get("split") or [])
    if not sizes:
        parts = node.get("num_outputs") or node.outputs
        chunk = -(-x.shape[axis] // parts)
        sizes = [min(chunk, x.shape[axis] - i * chunk) for i in range(parts)]
    return list(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


def _axes(inputs: Sequence[Array | None], node: NodeInfo, since: int) -> list[int] | None:
    if node.opset >= since:
        value = optional(inputs, 1)
        return None if value is None else ints(value)
    axes = node.get("axes")
    return None if axes is None else list(axes)


def _squeeze(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x = required(inputs, 0, node)
    axes = _axes(inputs, node, 13)
    return [np.squeeze(x, axis=None if axes is None else tuple(axes))]


def _unsqueeze(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x = required(inputs, 0, node)
    axes = _axes(inputs, node, 13) or []
    rank = x.ndim + len(axes)
    return [np.expand_dims(x, tuple(sorted(a % rank for a in axes)))]


def _gather(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x, index = required(inputs, 0, node), required(inputs, 1, node)
    axis = node.get("axis", 0)
    index = np.where(index < 0, index + x.shape[axis], index)
    return [np.take(x, index, axis=axis)]


def _slice(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x = required(inputs, 0, node)
    if node.opset < 10:
        starts, ends = list(node.get("starts")), list(node.get("ends"))
        axes, steps = node.get("axes") or list(range(len(starts))), [1] * len(starts)
    else:
        starts, ends = ints(required(inputs, 1, node)), ints(required(inputs, 2, node))
        axes = ints(optional(inputs, 3)) or list(range(len(starts)))
        steps = ints(optional(inputs, 4)) or [1] * len(starts)
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        index[axis] = slice(start, end, step)
    return [x[tuple(index)]]


def _expand(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x, shape = required(inputs, 0, node), ints(required(inputs, 1, node))
    return [x * np.ones(shape, dtype=x.dtype)]


def _constant(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    for key, dtype in (("value", None), ("value_float", np.float32), ("value_int", np.int64),
                       ("value_floats", np.float32), ("value_ints", np.int64)):
        if key in node.attrs:
            return [np.asarray(node.attrs[key], dtype=dtype)]
    raise node.refuse("only dense value* attributes are supported")


def _constant_of_shape(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    value = node.get("value")
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    return [np.full(ints(required(inputs, 0, node)), fill[0], dtype=fill.dtype)]


def _range(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    start, limit, delta = (required(inputs, i, node) for i in range(3))
    return [np.arange(start.item(), limit.item(), delta.item()).astype(start.dtype)]


def _pad(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x = required(inputs, 0, node)
    mode = node.get("mode", "constant")
    if node.opset < 11:
        pads, value = list(node.get("pads")), node.get("value", 0.0)
    else:
        pads = ints(required(inputs, 1, node))
        fill = optional(inputs, 2)
        value = 0.0 if fill is None or fill.size == 0 else float(fill.reshape(-1)[0])
    axes = ints(optional(inputs, 3)) or list(range(x.ndim))
    width = [(0, 0)] * x.ndim
    half = len(pads) // 2
    for i, axis in enumerate(axes):
        width[axis] = (pads[i], pads[i + half])
    if min(pads, default=0) < 0:
        raise node.refuse("negative pads are not supported")
    if mode == "constant":
        return [np.pad(x, width, constant_values=value)]
    if mode in ("reflect", "edge"):
        return [np.pad(x, width, mode=mode)]
    raise node.refuse(f"pad mode {mode!r} is not supported")


def _mod(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    a, b = required(inputs, 0, node), required(inputs, 1, node)
    return [np.fmod(a, b) if node.get("fmod", 0) else np.mod(a, b)]


def _tile(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    return [np.tile(required(inputs, 0, node), ints(required(inputs, 1, node)))]


def _identity(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    return [required(inputs, 0, node)]


TENSOR_OPS: dict[str, OpFn] = {
    "Add": _binary(np.add), "Sub": _binary(np.subtract), "Mul": _binary(np.multiply),
    "Div": _binary(_div), "Pow": _binary(lambda a, b: np.power(a, b).astype(a.dtype)),
    "Equal": _binary(np.equal), "Less": _binary(np.less), "Greater": _binary(np.greater),
    "And": _binary(np.logical_and), "Or": _binary(np.logical_or),
    "Max": _variadic(np.maximum), "Min": _variadic(np.minimum), "Sum": _variadic(np.add),
    "Relu": _unary(lambda x: np.maximum(x, np.zeros((), x.dtype))),
    "Sigmoid": _unary(_sigmoid), "Tanh": _unary(np.tanh), "Exp": _unary(np.exp),
    "Log": _unary(np.log), "Sqrt": _unary(np.sqrt), "Neg": _unary(np.negative),
    "Abs": _unary(np.abs), "Floor": _unary(np.floor), "Ceil": _unary(np.ceil),
    "Reciprocal": _unary(lambda x: np.float32(1) / x), "Erf": _unary(erf),
    "Not": _unary(np.logical_not),
    "Clip": _clip, "LeakyRelu": _leaky_relu, "HardSigmoid": _hard_sigmoid,
    "HardSwish": _hard_swish, "Gelu": _gelu, "Cast": _cast, "Where": _where,
    "Identity": _identity, "Dropout": _identity, "Mod": _mod, "Tile": _tile,
    "Shape": _shape, "Reshape": _reshape, "Flatten": _flatten, "Transpose": _transpose,
    "Concat": _concat, "Split": _split, "Squeeze": _squeeze, "Unsqueeze": _unsqueeze,
    "Gather": _gather, "Slice": _slice, "Expand": _expand, "Constant": _constant,
    "ConstantOfShape": _constant_of_shape, "Range": _range, "Pad": _pad,
}
