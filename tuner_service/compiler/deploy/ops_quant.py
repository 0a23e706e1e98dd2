"""numpy implementations of the quantized operators: QuantizeLinear, DequantizeLinear,
DynamicQuantizeLinear, QLinearConv, QLinearMatMul, MatMulInteger, ConvInteger, onnxruntime's
``com.microsoft`` QLinearAdd / QLinearMul / QLinearGlobalAveragePool, and our own
``tuner.int8`` Int8Layer (a quantized Conv/MatMul/Gemm the frontend recognised, see
``frontend.quantized``).

Integer products are exact (sums of integer products in float64 stay far below 2**53); a
requantization is onnxruntime's: fp32 ``acc * (x_scale * w_scale / y_scale)``, round half to
even, add the zero point, saturate. Quantizing divides by the scale in fp32, as onnxruntime
does, so outputs match it exactly except where it rounds a tie differently (one unit).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
import onnx

from schedule_templates.quant_add import FusedAdd
from schedule_templates.workloads import parse_workload
from schedule_templates.workloads.lowp import add_requantized, requantize
from schedule_templates.workloads.quant_conv import Conv2dInt8, residual_added
from tuner_service.compiler.deploy.node import Array, NodeInfo, OpFn, optional, required
from tuner_service.compiler.frontend.quantized_ops import (
    INT8_DOMAIN,
    INT8_OP,
    int8_layer_inputs,
)

logger = logging.getLogger(__name__)

_RANGES = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127),
           np.dtype(np.uint16): (0, 65535), np.dtype(np.int16): (-32768, 32767),
           np.dtype(np.int32): (-(2**31), 2**31 - 1)}


def _zero_point(zp: Array | None, default: type[np.generic] = np.uint8) -> Array:
    return np.zeros((), dtype=default) if zp is None else np.asarray(zp)


def _scalar(value: Array) -> float:
    return float(np.asarray(value).reshape(-1)[0])


def _per_axis(value: Array, ndim: int, axis: int) -> Array:
    """A scalar, or a 1-D per-channel array laid along ``axis`` of an ``ndim`` tensor."""
    value = np.asarray(value)
    if value.size == 1 or ndim == 0:
        return value.reshape(())
    shape = [1] * ndim
    shape[axis % ndim] = value.size
    return value.reshape(shape)


def quantize(x: Array, scale: Array, zero_point: Array, axis: int = 1) -> Array:
    """fp32 ``x / scale``, round half to even, plus the zero point, saturated to its type."""
    ndim = np.asarray(x).ndim
    zp = _per_axis(zero_point, ndim, axis)
    lo, hi = _RANGES[zp.dtype]
    # an array even for a 0-d x (a Constant's conversion, folded at load): rint writes into it
    value = np.array(np.asarray(x, np.float32) / _per_axis(scale, ndim, axis).astype(np.float32),
                     dtype=np.float32, ndmin=0)
    if zp.dtype.itemsize <= 2:  # fp32 holds every sum below 2**24 exactly: stay in fp32
        value = np.rint(value, out=value)
        value += zp.astype(np.float32)
        return np.clip(value, lo, hi, out=value).astype(zp.dtype)
    q = np.rint(value).astype(np.int64) + zp.astype(np.int64)
    return np.clip(q, lo, hi).astype(zp.dtype)


def dequantize(x: Array, scale: Array, zero_point: Array | None, axis: int = 1) -> Array:
    x = np.asarray(x)
    ndim = x.ndim
    if x.dtype.itemsize <= 2:  # 8/16-bit: the difference is exact in fp32
        zp32 = 0 if zero_point is None else _per_axis(zero_point, ndim, axis).astype(np.float32)
        centered = x.astype(np.float32)
        centered -= zp32
        centered *= _per_axis(scale, ndim, axis).astype(np.float32)
        return centered
    zp = 0 if zero_point is None else _per_axis(zero_point, ndim, axis).astype(np.int64)
    centered = (x.astype(np.int64) - zp).astype(np.float32)
    return (centered * _per_axis(scale, ndim, axis).astype(np.float32)).astype(np.float32)


def _quantize_linear(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x, scale = required(inputs, 0, node), required(inputs, 1, node)
    if node.get("block_size", 0):
        raise node.refuse("blocked quantization (block_size) is not supported")
    return [quantize(x, scale, _zero_point(optional(inputs, 2)), node.get("axis", 1))]


def _dequantize_linear(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x, scale = required(inputs, 0, node), required(inputs, 1, node)
    if node.get("block_size", 0):
        raise node.refuse("blocked quantization (block_size) is not supported")
    return [dequantize(x, scale, optional(inputs, 2), node.get("axis", 1))]


def _dynamic_quantize_linear(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    """u8 with the scale and zero point that map [min(x, 0), max(x, 0)] onto 0..255."""
    x = np.asarray(required(inputs, 0, node), np.float32)
    low = np.float32(min(float(x.min(initial=0.0)), 0.0))
    high = np.float32(max(float(x.max(initial=0.0)), 0.0))
    scale = np.float32((high - low) / np.float32(255.0))
    if scale == 0:
        zp = np.uint8(0)
        return [np.zeros(x.shape, np.uint8), np.array(scale, np.float32), np.array(zp)]
    zp = np.uint8(np.clip(np.rint(np.float32(0.0) - low / scale), 0, 255))
    return [quantize(x, np.array(scale), np.array(zp)), np.array(scale, np.float32),
            np.array(zp)]


def _centered(x: Array, zero_point: Array | None, ndim_axis: int | None = None) -> Array:
    """``x - zero_point`` in float64 (exact); a per-row/column zero point broadcasts."""
    value = np.asarray(x).astype(np.float64)
    if zero_point is None:
        return value
    zp = np.asarray(zero_point).astype(np.float64)
    if zp.size > 1 and ndim_axis is not None:
        zp = _per_axis(zp, value.ndim, ndim_axis)
    return value - (zp.reshape(()) if zp.size == 1 else zp)


def int_conv(x: Array, w: Array, node: NodeInfo) -> Array:
    """An exact integer-valued NCHW convolution (float64 in, float64 out) with the node's
    strides, dilations, explicit pads and group count."""
    if x.ndim != 4:
        raise node.refuse(f"only 2-D convolution is supported, got a rank-{x.ndim} input")
    if node.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise node.refuse("auto_pad SAME_* is not supported for integer convolutions")
    group = int(node.get("group", 1))
    sh, sw = [*list(node.get("strides") or [1, 1]), 1, 1][:2]
    dh, dw = [*list(node.get("dilations") or [1, 1]), 1, 1][:2]
    pads = list(node.get("pads") or [0, 0, 0, 0])
    padded = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    k, cg, r, s = w.shape
    oh = (padded.shape[2] - dh * (r - 1) - 1) // sh + 1
    ow = (padded.shape[3] - dw * (s - 1) - 1) // sw + 1
    n, kg = x.shape[0], k // group
    out = np.zeros((n, k, oh, ow), np.float64)
    for i in range(r):
        for j in range(s):
            view = padded[:, :, i * dh: i * dh + sh * (oh - 1) + 1: sh,
                          j * dw: j * dw + sw * (ow - 1) + 1: sw]
            for g in range(group):
                part = view[:, g * cg:(g + 1) * cg]
                taps = w[g * kg:(g + 1) * kg, :, i, j]
                out[:, g * kg:(g + 1) * kg] += np.einsum("nchw,kc->nkhw", part, taps)
    return out


def _output_scale(x_scale: Array, w_scale: Array, y_scale: Array) -> Array:
    """onnxruntime's requantization multiplier, in its fp32 order: x * w / y."""
    product = np.float32(np.asarray(x_scale).reshape(-1)[0]) * np.asarray(w_scale, np.float32)
    return (product / np.float32(np.asarray(y_scale).reshape(-1)[0])).astype(np.float32)


def _requantized(acc: Array, scale: Array, zero_point: Array | None) -> Array:
    zp = _zero_point(zero_point)
    out = "u8" if zp.dtype == np.uint8 else "s8"
    return requantize(acc, scale, int(zp.reshape(-1)[0]), out)


def _qlinear_conv(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x, w = required(inputs, 0, node), required(inputs, 3, node)
    acc = int_conv(_centered(x, inputs[2]), _centered(w, optional(inputs, 5), 0), node)
    bias = optional(inputs, 8)
    if bias is not None:
        acc += np.asarray(bias, np.float64).reshape(1, -1, 1, 1)
    scale = _output_scale(required(inputs, 1, node), required(inputs, 4, node),
                          required(inputs, 6, node)).reshape(1, -1, 1, 1)
    return [_requantized(acc.astype(np.int32), scale, optional(inputs, 7))]


def _qlinear_matmul(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    a, b = required(inputs, 0, node), required(inputs, 3, node)
    acc = np.matmul(_centered(a, inputs[2]), _centered(b, optional(inputs, 5), -1))
    scale = _output_scale(required(inputs, 1, node), required(inputs, 4, node),
                          required(inputs, 6, node))
    return [_requantized(acc.astype(np.int32), scale, optional(inputs, 7))]


def _matmul_integer(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    a, b = required(inputs, 0, node), required(inputs, 1, node)
    acc = np.matmul(_centered(a, optional(inputs, 2), -2), _centered(b, optional(inputs, 3), -1))
    return [acc.astype(np.int32)]


def _conv_integer(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    x, w = required(inputs, 0, node), required(inputs, 1, node)
    acc = int_conv(_centered(x, optional(inputs, 2)), _centered(w, optional(inputs, 3), 0), node)
    return [acc.astype(np.int32)]


def _qlinear_binary(op: str) -> OpFn:
    """onnxruntime's QLinearAdd / QLinearMul: its own fused arithmetic for an addition of one
    shape (``FusedAdd``), else dequantize, compute in fp32, quantize."""
    def run(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
        x, y = required(inputs, 0, node), required(inputs, 3, node)
        if op == "add" and x.shape == y.shape:
            zero_points = [_zero_point(optional(inputs, i)) for i in (2, 5, 7)]
            fused = FusedAdd.of(
                _scalar(required(inputs, 1, node)), int(zero_points[0].reshape(-1)[0]),
                _scalar(required(inputs, 4, node)), int(zero_points[1].reshape(-1)[0]),
                _scalar(required(inputs, 6, node)), int(zero_points[2].reshape(-1)[0]))
            return [fused.numpy(x, y, str(zero_points[2].dtype)).reshape(x.shape)]
        a = dequantize(required(inputs, 0, node), required(inputs, 1, node), inputs[2])
        b = dequantize(required(inputs, 3, node), required(inputs, 4, node), optional(inputs, 5))
        value = a + b if op == "add" else a * b
        return [quantize(value, required(inputs, 6, node), _zero_point(optional(inputs, 7)))]
    return run


def _qlinear_global_average_pool(inputs: Sequence[Array | None], node: NodeInfo
                                 ) -> list[Array]:
    x = dequantize(required(inputs, 0, node), required(inputs, 1, node), inputs[2])
    axes = tuple(range(1, x.ndim - 1)) if node.get("channels_last", 0) else tuple(
        range(2, x.ndim))
    mean = x.mean(axis=axes, keepdims=True, dtype=np.float64).astype(np.float32)
    return [quantize(mean, required(inputs, 3, node), _zero_point(optional(inputs, 4)))]


def _qgemm(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    """onnxruntime's QGemm: int32 bias added to the accumulator; fp32 out without y_scale."""
    a, b = required(inputs, 0, node), required(inputs, 3, node)
    a_c = _centered(a, inputs[2])
    b_c = _centered(b, optional(inputs, 5), 0 if node.get("transB", 0) else -1)
    acc = (a_c.T if node.get("transA", 0) else a_c) @ (b_c.T if node.get("transB", 0) else b_c)
    bias = optional(inputs, 6)
    if bias is not None:
        acc = acc + np.asarray(bias, np.float64)
    scale = np.float32(node.get("alpha", 1.0)) * _output_scale(
        required(inputs, 1, node), required(inputs, 4, node), np.ones(1, np.float32))
    y_scale = optional(inputs, 7)
    if y_scale is None:
        return [(acc.astype(np.int32).astype(np.float32) * scale).astype(np.float32)]
    scale = (scale / np.float32(np.asarray(y_scale).reshape(-1)[0])).astype(np.float32)
    return [_requantized(acc.astype(np.int32), scale, optional(inputs, 8))]


def _int8_layer(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    """The numpy int8 reference of a quantized layer: exact accumulation, bias, requantize,
    ReLU as a clamp at the output zero point, a fused quantized addition, in the ONNX output's
    shape."""
    workload = parse_workload(str(node.get("workload")))
    named = int8_layer_inputs(workload, inputs)
    acc = workload.accumulate(named)  # type: ignore[attr-defined]  # bias included
    channels = ((-1,) if acc.ndim != 4 else workload.channel_shape()
                if isinstance(workload, Conv2dInt8) else (1, -1, 1, 1))
    scale = np.asarray(named["scale"], np.float32).reshape(channels)
    zp = named.get("out_zero_point")
    out = str(getattr(workload, "out", "u8"))
    result = requantize(acc, scale, None if zp is None else int(zp.reshape(-1)[0]), out)
    if node.get("relu", 0):
        floor = 0 if zp is None else zp.reshape(-1)[0]
        result = np.maximum(result, floor).astype(result.dtype)
    added = str(getattr(workload, "add", "none"))
    if added != "none":  # a quantized bias addition fused into the layer (``quantized_bias``)
        result = add_requantized(result, named, added)
    shortcut = str(getattr(workload, "residual", "none"))
    if shortcut != "none":  # a shortcut addition fused into the layer (``quantized_residual``)
        result = (workload.shortcut_added(result, named) if isinstance(workload, Conv2dInt8)
                  else residual_added(result, named, shortcut))
    return [result.reshape(tuple(node.get("shape")))]


def _int8_binary(combine: Callable[[Array, Array], Array]) -> OpFn:
    def run(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
        """``tuner.int8`` Int8Add / Int8Mul: an addition of one shape without a Relu as
        onnxruntime fuses it (``FusedAdd``, as the generated kernel); otherwise the unfused
        DequantizeLinear x2 -> Add|Mul [-> Relu] -> QuantizeLinear, in one pass (same fp32
        operations, same order)."""
        x, y = required(inputs, 0, node), required(inputs, 1, node)
        if combine is np.add and not node.get("relu", 0) and x.shape == y.shape:
            fused = FusedAdd.of(
                float(node.get("a_scale")), int(node.get("a_zero_point")),
                float(node.get("b_scale")), int(node.get("b_zero_point")),
                float(node.get("y_scale")), int(node.get("y_zero_point")))
            out = "uint8" if node.get("out") == "u8" else "int8"
            return [fused.numpy(x, y, out)]
        a = dequantize(required(inputs, 0, node), np.array(node.get("a_scale"), np.float32),
                       np.array(node.get("a_zero_point"), np.int32))
        b = dequantize(required(inputs, 1, node), np.array(node.get("b_scale"), np.float32),
                       np.array(node.get("b_zero_point"), np.int32))
        value = np.asarray(combine(a, b), np.float32)
        if node.get("relu", 0):
            np.maximum(value, np.float32(0), out=value)
        zp = np.array(node.get("y_zero_point"),
                      np.uint8 if node.get("out") == "u8" else np.int8)
        return [quantize(value, np.array(node.get("y_scale"), np.float32), zp)]

    return run


_int8_add = _int8_binary(np.add)


def _int8_table(inputs: Sequence[Array | None], node: NodeInfo) -> list[Array]:
    """``tuner.int8`` Int8Table: each 8-bit value looked up in its 256-entry table."""
    x, table = np.asarray(required(inputs, 0, node)), np.asarray(required(inputs, 1, node))
    low = -128 if x.dtype == np.int8 else 0
    return [table[x.astype(np.int16) - low]]


#: int8 products without a kernel in model libraries (reported with the Int8Layer steps)
_INT8_ANCHORS = frozenset({"QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger",
                           "QGemm"})

#: standard-domain operators (merged into the executor's table)
QUANT_OPS: dict[str, OpFn] = {
    "QuantizeLinear": _quantize_linear, "DequantizeLinear": _dequantize_linear,
    "DynamicQuantizeLinear": _dynamic_quantize_linear, "QLinearConv": _qlinear_conv,
    "QLinearMatMul": _qlinear_matmul, "MatMulInteger": _matmul_integer,
    "ConvInteger": _conv_integer,
}

#: (domain, operator) -> implementation, for operators outside the standard domain
DOMAIN_OPS: dict[tuple[str, str], OpFn] = {
    ("com.microsoft", "QLinearAdd"): _qlinear_binary("add"),
    ("com.microsoft", "QLinearMul"): _qlinear_binary("mul"),
    ("com.microsoft", "QLinearGlobalAveragePool"): _qlinear_global_average_pool,
    ("com.microsoft", "QGemm"): _qgemm,
    (INT8_DOMAIN, INT8_OP): _int8_layer,
    (INT8_DOMAIN, "Int8Add"): _int8_add,
    (INT8_DOMAIN, "Int8Mul"): _int8_binary(np.multiply),
    (INT8_DOMAIN, "Int8Table"): _int8_table,
}


def warn_int8_reference(steps: Sequence[object]) -> int:
    """Log once which int8 layers run as numpy reference steps, and why; returns how many."""
    layers = [step for step in steps  # numpy steps (``fn``), not int8 kernel steps
              if hasattr(step, "fn") and _is_int8_layer(getattr(step, "node", None))]
    if not layers:
        return 0
    from schedule_templates.codegen.llvm_jit import host_features

    host = ("" if "+avx512vnni" in host_features() else
            "; this host also lacks AVX-512 VNNI, which our int8 kernels need")
    first = layers[0].node  # type: ignore[attr-defined]
    logger.warning("%d int8 layer(s) (e.g. %r, %s) run as numpy int8 reference steps "
                   "(integer exact, slow): no int8 kernel in the library for them%s",
                   len(layers), first.name,
                   _attribute_text(first, "workload") or first.op_type, host)
    return len(layers)


def _is_int8_layer(node: onnx.NodeProto | None) -> bool:
    return node is not None and ((node.domain, node.op_type) == (INT8_DOMAIN, INT8_OP)
                                 or node.op_type in _INT8_ANCHORS)


def _attribute_text(node: onnx.NodeProto, key: str) -> str:
    for attr in node.attribute:
        if attr.name == key:
            return attr.s.decode(errors="replace")
    return ""
