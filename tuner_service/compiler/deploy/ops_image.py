"""numpy implementations of image and normalization operators popular models use beyond the
basic set: Resize (nearest, linear), PRelu, InstanceNormalization, LRN, DepthToSpace /
SpaceToDepth, Einsum. Modes these do not handle (cubic Resize, antialiasing, ...) refuse, and the
runner moves such a node to onnx's reference evaluator."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tuner_service.compiler.deploy.node import Array, NodeInfo, OpFn, ints, optional, required

# -- Resize ------------------------------------------------------------------------------------


def _resize_plan(x: Array, inputs: Sequence[Array | None], node: NodeInfo
                 ) -> tuple[list[int], list[float]]:
    """Output size and scale per axis of ``x``."""
    if node.opset < 11:
        scales_in, sizes_in = optional(inputs, 1), None
    else:
        scales_in, sizes_in = optional(inputs, 2), optional(inputs, 3)
    axes = list(node.get("axes") or range(x.ndim))
    axes = [a % x.ndim for a in axes]
    if node.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise node.refuse("keep_aspect_ratio_policy other than stretch is not supported")
    sizes, scales = list(x.shape), [1.0] * x.ndim
    if sizes_in is not None and sizes_in.size:
        for axis, size in zip(axes, ints(sizes_in), strict=True):
            sizes[axis], scales[axis] = size, size / x.shape[axis]
    elif scales_in is not None and scales_in.size:
        for axis, scale in zip(axes, np.asarray(scales_in, np.float64).reshape(-1), strict=True):
            scales[axis] = float(scale)
            sizes[axis] = int(np.floor(x.shape[axis] * float(scale)))
    else:
        raise node.refuse("neither scales nor sizes is given")
    return sizes, scales


def _source_coordinates(out: int, size: int, scale: float, mode: str, node: NodeInfo
                        ) -> Array:
    """Where each output index samples the input axis (``coordinate_transformation_mode``)."""
    i = np.arange(out, dtype=np.float64)
    if mode == "half_pixel":
        return (i + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (i + 0.5) / scale - 0.5 if out > 1 else np.zeros(out)
    if mode == "align_corners":
        return i * (size - 1) / (out - 1) if out > 1 else np.zeros(out)
    if mode == "asymmetric":
        return i / scale
    if mode == "half_pixel_symmetric":
        offset = size / 2 * (1 - out / (scale * size))
        return offset + (i + 0.5) / scale - 0.5
    raise node.refuse(f"coordinate_transformation_mode {mode!r} is not supported")


def _nearest(coords: Array, mode: str, node: NodeInfo) -> Array:
    if mode == "round_prefer_floor":
        return np.ceil(coords - 0.5)
    if mode == "round_prefer_ceil":
        return np.floor(coords + 0.5)
    if mode == "floor":
        return np.floor(coords)
    if mode == "ceil":
        return np.ceil(coords)
    raise node.refuse(f"nearest_mode {mode!r} is not supported")


def _resize(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x = required(inputs, 0, node)
    mode = node.get("mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise node.refuse(f"mode {mode!r} is not supported")
    if node.get("antialias", 0):
        raise node.refuse("antialias=1 is not supported")
    transform = node.get("coordinate_transformation_mode", "half_pixel")
    rounding = node.get("nearest_mode", "round_prefer_floor")
    if node.opset < 11:  # Upsample and Resize-10: index = floor(i / scale)
        transform, rounding = "asymmetric", "floor"
    sizes, scales = _resize_plan(x, inputs, node)
    out = x
    for axis, (size, scale) in enumerate(zip(sizes, scales, strict=True)):
        if size == x.shape[axis] and scale == 1.0:
            continue
        coords = _source_coordinates(size, x.shape[axis], scale, transform, node)
        last = x.shape[axis] - 1
        if mode == "nearest":
            index = np.clip(_nearest(coords, rounding, node), 0, last).astype(np.int64)
            out = np.take(out, index, axis=axis)
            continue
        low = np.floor(coords)
        weight = (coords - low).astype(x.dtype)
        shape = [1] * x.ndim
        shape[axis] = size
        lo = np.take(out, np.clip(low, 0, last).astype(np.int64), axis=axis)
        hi = np.take(out, np.clip(low + 1, 0, last).astype(np.int64), axis=axis)
        out = lo + (hi - lo) * weight.reshape(shape)
    return [np.ascontiguousarray(out)]


# -- normalization -----------------------------------------------------------------------------


def _prelu(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x, slope = required(inputs, 0, node), required(inputs, 1, node)
    return [np.where(x < 0, x * slope, x).astype(x.dtype)]


def _instance_norm(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x, scale, bias = (required(inputs, i, node) for i in range(3))
    axes = tuple(range(2, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    centered = x - mean
    var = np.mean(centered * centered, axis=axes, keepdims=True)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    out = centered / np.sqrt(var + np.float32(node.get("epsilon", 1e-5)))
    return [(out * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)]


def _lrn(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    """Local response normalization across channels (AlexNet, GoogLeNet)."""
    x = required(inputs, 0, node)
    size = int(node.get("size"))
    alpha, beta = float(node.get("alpha", 1e-4)), float(node.get("beta", 0.75))
    bias = float(node.get("bias", 1.0))
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    width = [(0, 0)] * x.ndim
    width[1] = (before, after)
    square = np.pad(x.astype(np.float64) ** 2, width)
    total = np.zeros(x.shape, np.float64)
    for offset in range(size):
        total += square[:, offset : offset + x.shape[1]]
    return [(x / (bias + alpha / size * total) ** beta).astype(x.dtype)]


# -- reordering --------------------------------------------------------------------------------


def _depth_to_space(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x = required(inputs, 0, node)
    b = int(node.get("blocksize"))
    n, c, h, w = x.shape
    if node.get("mode", "DCR") == "CRD":
        tmp = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        tmp = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    return [tmp.reshape(n, c // (b * b), h * b, w * b)]


def _space_to_depth(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x = required(inputs, 0, node)
    b = int(node.get("blocksize"))
    n, c, h, w = x.shape
    tmp = x.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4)
    return [tmp.reshape(n, c * b * b, h // b, w // b)]


def _einsum(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    equation = str(node.get("equation")).replace(" ", "")
    arrays = [x for x in inputs if x is not None]
    out = np.einsum(equation, *arrays, optimize=len(arrays) > 2)
    return [np.asarray(out, dtype=arrays[0].dtype)]


IMAGE_OPS: dict[str, OpFn] = {
    "Resize": _resize, "Upsample": _resize, "PRelu": _prelu,
    "InstanceNormalization": _instance_norm, "LRN": _lrn,
    "DepthToSpace": _depth_to_space, "SpaceToDepth": _space_to_depth, "Einsum": _einsum,
}
