"""numpy implementations of pooling, normalization, reductions, softmax, and the fallbacks for
Conv / Gemm / MatMul nodes that no template covers (grouped convolutions, odd broadcasting)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from tuner_service.compiler.deploy.node import Array, NodeInfo, OpFn, ints, optional, required

# -- sliding windows -------------------------------------------------------------------------


def _window_pads(node: NodeInfo, size: Sequence[int], kernel: Sequence[int],
                 strides: Sequence[int], dilations: Sequence[int]) -> list[int]:
    """(begins..., ends...) padding per spatial axis, resolving auto_pad."""
    mode = node.get("auto_pad", "NOTSET")
    rank = len(size)
    if mode in ("NOTSET", ""):
        return list(node.get("pads") or [0] * (2 * rank))
    if mode == "VALID":
        return [0] * (2 * rank)
    begins, ends = [], []
    for n, k, s, d in zip(size, kernel, strides, dilations, strict=True):
        total = max(0, (-(-n // s) - 1) * s + d * (k - 1) + 1 - n)
        small, large = total // 2, total - total // 2
        begins.append(small if mode == "SAME_UPPER" else large)
        ends.append(large if mode == "SAME_UPPER" else small)
    return begins + ends


def _taps(x: Array, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
          out: Sequence[int]) -> Iterator[tuple[tuple[int, int], Array]]:
    """(tap, strided view of shape N, C, OH, OW) of an already padded 4-D input."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
    for r in range(kh):
        for s in range(kw):
            rows = slice(r * dh, r * dh + sh * (out[0] - 1) + 1, sh)
            cols = slice(s * dw, s * dw + sw * (out[1] - 1) + 1, sw)
            yield (r, s), x[:, :, rows, cols]


def _pool_geometry(x: Array, node: NodeInfo) -> tuple[list[int], list[int], list[int],
                                                      list[int], list[int]]:
    if x.ndim != 4:
        raise node.refuse(f"only 2-D pooling (4-D input) is supported, got rank {x.ndim}")
    kernel = list(node.get("kernel_shape"))
    strides = list(node.get("strides") or [1, 1])
    dilations = list(node.get("dilations") or [1, 1])
    pads = _window_pads(node, x.shape[2:], kernel, strides, dilations)
    ceil = bool(node.get("ceil_mode", 0))
    out, extra = [], []
    for axis in range(2):
        span = x.shape[2 + axis] + pads[axis] + pads[axis + 2] - dilations[axis] * (
            kernel[axis] - 1) - 1
        n = (-(-span // strides[axis]) if ceil else span // strides[axis]) + 1
        if ceil and (n - 1) * strides[axis] >= x.shape[2 + axis] + pads[axis]:
            n -= 1  # the last window must start inside the input or its left padding
        out.append(n)
        extra.append(max(0, (n - 1) * strides[axis] + dilations[axis] * (kernel[axis] - 1)
                         + 1 - x.shape[2 + axis] - pads[axis] - pads[axis + 2]))
    return kernel, strides, dilations, pads, out + extra


def _max_pool(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    """Separable (the max over the window's rows, then over its columns: kh + kw passes
    instead of kh * kw) and without a padded copy: each tap covers the outputs whose source
    index falls inside the input."""
    x = required(inputs, 0, node)
    if node.outputs > 1:
        raise node.refuse("the Indices output of MaxPool is not supported")
    kernel, strides, dilations, pads, geo = _pool_geometry(x, node)
    rows = _window_max(x, 2, kernel[0], strides[0], dilations[0], pads[0], geo[0])
    return [_window_max(rows, 3, kernel[1], strides[1], dilations[1], pads[1], geo[1])]


def _window_max(x: Array, axis: int, size: int, stride: int, dilation: int, pad: int,
                out: int) -> Array:
    src: list[slice] = [slice(None)] * x.ndim
    dst: list[slice] = [slice(None)] * x.ndim
    ranges = []
    for tap in range(size):
        offset = tap * dilation - pad  # source index of output i is i * stride + offset
        lo = -(offset // stride) if offset < 0 else 0
        hi = min(out, (x.shape[axis] - 1 - offset) // stride + 1)
        if hi > lo:
            ranges.append((lo, hi, offset))
    result: Array | None = None
    full = [r for r in ranges if r[:2] == (0, out)]
    if full:  # a tap every output sees (the centre one, usually): start from a copy of it
        ranges.remove(full[0])
        src[axis] = slice(full[0][2], full[0][2] + stride * (out - 1) + 1, stride)
        result = x[tuple(src)].copy()
    else:
        shape = list(x.shape)
        shape[axis] = out
        lowest = np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf  # 8-bit MaxPool
        result = np.full(shape, lowest, dtype=x.dtype)
    for lo, hi, offset in ranges:
        first = lo * stride + offset
        src[axis] = slice(first, first + stride * (hi - lo - 1) + 1, stride)
        dst[axis] = slice(lo, hi)
        view = result[tuple(dst)]
        np.maximum(view, x[tuple(src)], out=view)
    return result


def _average_pool(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x = required(inputs, 0, node)
    kernel, strides, dilations, pads, geo = _pool_geometry(x, node)
    width = ((0, 0), (0, 0), (pads[0], pads[2] + geo[2]), (pads[1], pads[3] + geo[3]))
    padded = np.pad(x, width)
    ones = np.zeros((1, 1, *padded.shape[2:]), dtype=np.float32)
    if node.get("count_include_pad", 0):
        ones[:, :, : padded.shape[2] - geo[2], : padded.shape[3] - geo[3]] = 1
    else:
        ones[:, :, pads[0] : pads[0] + x.shape[2], pads[1] : pads[1] + x.shape[3]] = 1
    total = np.zeros((x.shape[0], x.shape[1], *geo[:2]), dtype=np.float32)
    count = np.zeros((1, 1, *geo[:2]), dtype=np.float32)
    for tap, view in _taps(padded, kernel, strides, dilations, geo[:2]):
        total += view
        count += _shifted(ones, tap, dilations, strides, geo[:2])
    return [total / count]


def _shifted(mask: Array, tap: tuple[int, int], dilations: Sequence[int],
             strides: Sequence[int], out: Sequence[int]) -> Array:
    r, s = tap
    rows = slice(r * dilations[0], r * dilations[0] + strides[0] * (out[0] - 1) + 1, strides[0])
    cols = slice(s * dilations[1], s * dilations[1] + strides[1] * (out[1] - 1) + 1, strides[1])
    return mask[:, :, rows, cols]


def _global_average_pool(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x = required(inputs, 0, node)
    return [x.mean(axis=tuple(range(2, x.ndim)), keepdims=True, dtype=np.float32)]


def _global_max_pool(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x = required(inputs, 0, node)
    return [x.max(axis=tuple(range(2, x.ndim)), keepdims=True)]


def _conv(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    """A reference convolution for nodes no template runs (any group count, 2-D only)."""
    x, w, bias = required(inputs, 0, node), required(inputs, 1, node), optional(inputs, 2)
    if x.ndim != 4:
        raise node.refuse(f"only 2-D convolution is supported, got a rank-{x.ndim} input")
    group = node.get("group", 1)
    strides = list(node.get("strides") or [1, 1])
    dilations = list(node.get("dilations") or [1, 1])
    kernel = list(w.shape[2:])
    pads = _window_pads(node, x.shape[2:], kernel, strides, dilations)
    padded = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    out_hw = [(padded.shape[2 + a] - dilations[a] * (kernel[a] - 1) - 1) // strides[a] + 1
              for a in range(2)]
    n, k = x.shape[0], w.shape[0]
    cg, kg = x.shape[1] // group, k // group
    out = np.zeros((n, k, *out_hw), dtype=np.float32)
    for (r, s), view in _taps(padded, kernel, strides, dilations, out_hw):
        for g in range(group):
            part = view[:, g * cg : (g + 1) * cg]
            taps = w[g * kg : (g + 1) * kg, :, r, s]
            out[:, g * kg : (g + 1) * kg] += np.einsum("nchw,kc->nkhw", part, taps)
    if bias is not None:
        out += bias.reshape(1, -1, 1, 1)
    return [out]


def _gemm(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    a, b, c = required(inputs, 0, node), required(inputs, 1, node), optional(inputs, 2)
    a = a.T if node.get("transA", 0) else a
    b = b.T if node.get("transB", 0) else b
    out = np.float32(node.get("alpha", 1.0)) * (a @ b)
    if c is not None:
        out = out + np.float32(node.get("beta", 1.0)) * c
    return [out.astype(np.float32)]


def _matmul(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    return [np.matmul(required(inputs, 0, node), required(inputs, 1, node))]


# -- normalization, reductions, softmax ------------------------------------------------------


def _batch_norm(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x = required(inputs, 0, node)
    scale, bias, mean, var = (required(inputs, i, node) for i in range(1, 5))
    if node.get("training_mode", 0):
        raise node.refuse("training_mode=1 is not inference")
    shape = (1, -1) + (1,) * (x.ndim - 2)
    factor = (scale / np.sqrt(var + np.float32(node.get("epsilon", 1e-5)))).astype(np.float32)
    shift = (bias - mean * factor).astype(np.float32)
    return [x * factor.reshape(shape) + shift.reshape(shape)]


def _layer_norm(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x, scale, bias = required(inputs, 0, node), required(inputs, 1, node), optional(inputs, 2)
    axis = node.get("axis", -1)
    axes = tuple(range(axis % x.ndim, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    centered = x - mean
    var = np.mean(centered * centered, axis=axes, keepdims=True)
    out = centered / np.sqrt(var + np.float32(node.get("epsilon", 1e-5))) * scale
    return [out + bias if bias is not None else out]


#: a reduction's body: (input, normalised axes, keepdims) -> result
ReduceFn = Callable[[Array, tuple[int, ...], bool], Array]


def reduce_op(fn: ReduceFn, since: int = 18) -> OpFn:
    """An ONNX Reduce* operator around ``fn`` (axes became an input at opset ``since``)."""
    def run(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
        x = required(inputs, 0, node)
        axes = ints(optional(inputs, 1)) if node.opset >= since else node.get("axes")
        if not axes:
            if node.get("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(x.ndim))
        out = fn(x, tuple(a % x.ndim for a in axes), bool(node.get("keepdims", 1)))
        return [np.asarray(out, dtype=x.dtype)]
    return run


def _numpy_reduce(name: str) -> ReduceFn:
    def fn(x: Array, axes: tuple[int, ...], keep: bool) -> Array:
        return np.asarray(getattr(np, name)(x, axis=axes, keepdims=keep))
    return fn


def _softmax_axes(x: Array, node: NodeInfo) -> tuple[Array, tuple[int, ...]]:
    if node.opset >= 13:
        return x, (node.get("axis", -1) % x.ndim,)
    axis = node.get("axis", 1) % x.ndim  # older opsets: softmax over the flattened tail
    return x, tuple(range(axis, x.ndim))


def _softmax(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x, axes = _softmax_axes(required(inputs, 0, node), node)
    e = np.exp(x - x.max(axis=axes, keepdims=True))
    return [e / e.sum(axis=axes, keepdims=True)]


def _log_softmax(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x, axes = _softmax_axes(required(inputs, 0, node), node)
    shifted = x - x.max(axis=axes, keepdims=True)
    return [shifted - np.log(np.exp(shifted).sum(axis=axes, keepdims=True))]


NN_OPS: dict[str, OpFn] = {
    "MaxPool": _max_pool, "AveragePool": _average_pool,
    "GlobalAveragePool": _global_average_pool, "GlobalMaxPool": _global_max_pool,
    "Conv": _conv, "Gemm": _gemm, "MatMul": _matmul,
    "BatchNormalization": _batch_norm, "LayerNormalization": _layer_norm,
    "ReduceMean": reduce_op(_numpy_reduce("mean")),
    "ReduceSum": reduce_op(_numpy_reduce("sum"), 13),
    "ReduceMax": reduce_op(_numpy_reduce("max")), "ReduceMin": reduce_op(_numpy_reduce("min")),
    "Softmax": _softmax, "LogSoftmax": _log_softmax,
}
