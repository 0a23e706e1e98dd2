"""numpy implementations of the less common element-wise, reduction and indexing operators
(activations of the ELU family, comparisons, norms, CumSum, ArgMax, TopK, Trilu, ...)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tuner_service.compiler.deploy.node import Array, NodeInfo, OpFn, ints, optional, required
from tuner_service.compiler.deploy.ops_nn import reduce_op


def _unary(fn: Callable[[Array, NodeInfo], Array]) -> OpFn:
    def run(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
        x = required(inputs, 0, node)
        return [np.asarray(fn(x, node), dtype=x.dtype)]
    return run


def _compare(fn: Callable[[Array, Array], Array]) -> OpFn:
    def run(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
        return [np.asarray(fn(required(inputs, 0, node), required(inputs, 1, node)))]
    return run


def _elu(x: Array, node: NodeInfo) -> Array:
    alpha = np.float32(node.get("alpha", 1.0))
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


def _selu(x: Array, node: NodeInfo) -> Array:
    alpha = np.float32(node.get("alpha", 1.67326319217681884765625))
    gamma = np.float32(node.get("gamma", 1.05070102214813232421875))
    return gamma * np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


def _celu(x: Array, node: NodeInfo) -> Array:
    alpha = np.float32(node.get("alpha", 1.0))
    return np.maximum(x, 0) + np.minimum(0, alpha * np.expm1(x / alpha))


def _softplus(x: Array, node: NodeInfo) -> Array:
    return np.logaddexp(x, np.zeros((), x.dtype))


def _mish(x: Array, node: NodeInfo) -> Array:
    return x * np.tanh(np.logaddexp(x, np.zeros((), x.dtype)))


def _thresholded_relu(x: Array, node: NodeInfo) -> Array:
    return np.where(x > np.float32(node.get("alpha", 1.0)), x, np.zeros((), x.dtype))


def _softsign(x: Array, node: NodeInfo) -> Array:
    return x / (1 + np.abs(x))


def _l1(x: Array, axes: tuple[int, ...], keep: bool) -> Array:
    return np.sum(np.abs(x), axis=axes, keepdims=keep)


def _l2(x: Array, axes: tuple[int, ...], keep: bool) -> Array:
    return np.sqrt(np.sum(np.square(x, dtype=np.float64), axis=axes, keepdims=keep))


def _sum_square(x: Array, axes: tuple[int, ...], keep: bool) -> Array:
    return np.sum(np.square(x), axis=axes, keepdims=keep)


def _log_sum_exp(x: Array, axes: tuple[int, ...], keep: bool) -> Array:
    top = np.max(x, axis=axes, keepdims=True)
    out = np.log(np.sum(np.exp(x - top), axis=axes, keepdims=True)) + top
    return out if keep else np.squeeze(out, axis=axes)


def _prod(x: Array, axes: tuple[int, ...], keep: bool) -> Array:
    return np.prod(x, axis=axes, keepdims=keep)


def _cumsum(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x, axis = required(inputs, 0, node), int(ints(required(inputs, 1, node))[0])
    axis %= x.ndim
    if node.get("reverse", 0):
        x = np.flip(x, axis)
    out = np.cumsum(x, axis=axis, dtype=x.dtype)
    if node.get("exclusive", 0):
        out = np.concatenate([np.zeros_like(np.take(out, [0], axis=axis)),
                              np.delete(out, -1, axis=axis)], axis=axis)
    return [np.flip(out, axis) if node.get("reverse", 0) else out]


def _arg(fn: Callable[..., Array]) -> OpFn:
    def run(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
        x = required(inputs, 0, node)
        axis = node.get("axis", 0) % x.ndim
        if node.get("select_last_index", 0):
            flipped = fn(np.flip(x, axis), axis=axis)
            index = x.shape[axis] - 1 - flipped
        else:
            index = fn(x, axis=axis)
        if node.get("keepdims", 1):
            index = np.expand_dims(index, axis)
        return [np.asarray(index, dtype=np.int64)]
    return run


def _topk(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x, k = required(inputs, 0, node), int(ints(required(inputs, 1, node))[0])
    axis = node.get("axis", -1) % x.ndim
    largest = bool(node.get("largest", 1))
    # stable sort: equal values keep the lower index first, as ONNX asks
    order = np.argsort(-x if largest else x, axis=axis, kind="stable")
    index = np.take(order, np.arange(k), axis=axis)
    return [np.take_along_axis(x, index, axis=axis), index.astype(np.int64)]


def _trilu(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x, k = required(inputs, 0, node), optional(inputs, 1)
    offset = 0 if k is None else int(ints(k)[0])
    upper = bool(node.get("upper", 1))
    return [np.triu(x, offset) if upper else np.tril(x, offset)]


def _gather_elements(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x, index = required(inputs, 0, node), required(inputs, 1, node)
    axis = node.get("axis", 0) % x.ndim
    index = np.where(index < 0, index + x.shape[axis], index)
    # the index may be smaller than x along the other axes too (take_along_axis wants equal)
    grid: list[Array] = list(np.indices(index.shape, sparse=True))
    grid[axis] = index
    return [x[tuple(grid)]]


def _gather_nd(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x, index = required(inputs, 0, node), required(inputs, 1, node)
    b = int(node.get("batch_dims", 0))
    depth = index.shape[-1]
    batch = x.shape[:b]
    count = int(np.prod(batch, dtype=np.int64))
    data = x.reshape(count, *x.shape[b:])
    picks = index.reshape(count, -1, depth)
    picks = np.where(picks < 0, picks + np.asarray(x.shape[b : b + depth]), picks)
    rows = np.arange(count).reshape(count, 1)
    out = data[(rows, *(picks[..., d] for d in range(depth)))]
    return [out.reshape(*batch, *index.shape[b:-1], *x.shape[b + depth :])]


def _size(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    return [np.asarray(required(inputs, 0, node).size, dtype=np.int64)]


def _is_inf(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x = required(inputs, 0, node)
    positive = np.isposinf(x) if node.get("detect_positive", 1) else np.zeros(x.shape, bool)
    negative = np.isneginf(x) if node.get("detect_negative", 1) else np.zeros(x.shape, bool)
    return [positive | negative]


def _mean(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    arrays = [x for x in inputs if x is not None]
    total = arrays[0]
    for x in arrays[1:]:
        total = total + x
    return [np.asarray(total / np.asarray(len(arrays), total.dtype), dtype=arrays[0].dtype)]


MISC_OPS: dict[str, OpFn] = {
    "Elu": _unary(_elu), "Selu": _unary(_selu), "Celu": _unary(_celu),
    "Softplus": _unary(_softplus), "Softsign": _unary(_softsign), "Mish": _unary(_mish),
    "ThresholdedRelu": _unary(_thresholded_relu),
    "Sin": _unary(lambda x, _: np.sin(x)), "Cos": _unary(lambda x, _: np.cos(x)),
    "Sign": _unary(lambda x, _: np.sign(x)), "Round": _unary(lambda x, _: np.round(x)),
    "IsNaN": lambda inputs, node: [np.isnan(required(inputs, 0, node))],
    "IsInf": _is_inf,
    "GreaterOrEqual": _compare(np.greater_equal), "LessOrEqual": _compare(np.less_equal),
    "Xor": _compare(np.logical_xor),
    "ReduceL1": reduce_op(_l1), "ReduceL2": reduce_op(_l2), "ReduceProd": reduce_op(_prod),
    "ReduceSumSquare": reduce_op(_sum_square), "ReduceLogSumExp": reduce_op(_log_sum_exp),
    "CumSum": _cumsum, "ArgMax": _arg(np.argmax), "ArgMin": _arg(np.argmin), "TopK": _topk,
    "Trilu": _trilu, "GatherElements": _gather_elements, "GatherND": _gather_nd,
    "Size": _size, "Mean": _mean,
}
