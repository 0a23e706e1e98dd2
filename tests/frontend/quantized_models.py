"""Small fp32 models quantized by onnxruntime's own tool (QDQ, QOperator, dynamic), for the
quantized frontend and deploy tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh

INPUT_SHAPE = (1, 3, 8, 8)


def float_model(seed: int = 0, residual: bool = False, computed_flatten: bool = False,
                product: bool = False, heads: bool = False, pool: bool = False
                ) -> onnx.ModelProto:
    """Conv(+bias) -> Relu -> Flatten -> MatMul -> Add -> Gemm(+bias): every int8 anchor.
    ``residual`` puts a ResNet block with a projection shortcut after the first Relu:
    Add(Conv 3x3, Conv 1x1) -> Relu, both convolutions reading the same activation (a quantized
    addition of two activations of one shape). ``computed_flatten`` flattens with a Reshape
    whose target an exporter computes at run time (``Shape -> Gather -> Mul -> Div -> Concat``:
    onnx's inference gives up at the Div, as in a torchscript BERT). ``product`` multiplies the
    residual block's two branches instead of adding them (a gate, as in BERT's GELU).
    ``heads`` splits the MatMul's 32 outputs into 4 heads of 8 and swaps the two axes before
    the Gemm (``Reshape -> Transpose -> Reshape``, as BERT's attention moves its heads).
    ``pool`` max-pools the first Relu's output (3x3, stride 1, padded: ResNet's stem pool
    without the downsampling), which ``quantize_static`` wraps in a DequantizeLinear and a
    QuantizeLinear of the same parameters."""
    rng = np.random.default_rng(seed)

    def weight(name: str, shape: tuple[int, ...], std: float) -> onnx.TensorProto:
        return nh.from_array(rng.normal(0, std, shape).astype(np.float32), name)

    inits = [weight("w1", (16, 3, 3, 3), 0.2), weight("b1", (16,), 0.1),
             weight("w2", (16 * 4 * 4, 32), 0.05), weight("b2", (32,), 0.1),
             weight("w3", (10, 32), 0.2), weight("b3", (10,), 0.1)]
    if computed_flatten:
        inits += [nh.from_array(np.array(v, np.int64), n) for n, v in
                  (("zero", 0), ("two", 2), ("axes", [0]), ("rest", [-1]))]
    if heads:
        inits += [nh.from_array(np.array([1, 4, 8], np.int64), "heads"),
                  nh.from_array(np.array([1, 32], np.int64), "joined")]
    if residual:
        inits += [weight("w4", (16, 16, 3, 3), 0.1), weight("w5", (16, 16, 1, 1), 0.3)]
    nodes = [
        oh.make_node("Conv", ["x", "w1", "b1"], ["c1"], "conv1", pads=[1, 1, 1, 1],
                     strides=[2, 2]),
        *([oh.make_node("Relu", ["c1"], ["r0"], "relu1"),
           oh.make_node("MaxPool", ["r0"], ["r1"], "pool", kernel_shape=[3, 3],
                        pads=[1, 1, 1, 1])] if pool
          else [oh.make_node("Relu", ["c1"], ["r1"], "relu1")]),
        *([oh.make_node("Conv", ["r1", "w4"], ["c2"], "conv2", pads=[1, 1, 1, 1]),
           oh.make_node("Conv", ["r1", "w5"], ["c3"], "shortcut"),
           oh.make_node("Mul" if product else "Add", ["c2", "c3"], ["s2"], "residual"),
           oh.make_node("Relu", ["s2"], ["r2"], "relu2")] if residual else []),
        *([oh.make_node("Shape", ["r1"], ["shape"], "shape"),
           oh.make_node("Gather", ["shape", "zero"], ["batch"], "batch", axis=0),
           oh.make_node("Mul", ["batch", "two"], ["twice"], "twice"),
           oh.make_node("Div", ["twice", "two"], ["again"], "again"),
           oh.make_node("Unsqueeze", ["again", "axes"], ["lead"], "lead"),
           oh.make_node("Concat", ["lead", "rest"], ["target"], "target", axis=0),
           oh.make_node("Reshape", ["r1", "target"], ["f"], "flat")] if computed_flatten
          else [oh.make_node("Flatten", ["r2" if residual else "r1"], ["f"], "flat")]),
        oh.make_node("MatMul", ["f", "w2"], ["m"], "mm"),
        oh.make_node("Add", ["m", "b2"], ["a"], "add"),
        *([oh.make_node("Reshape", ["a", "heads"], ["h"], "split_heads"),
           oh.make_node("Transpose", ["h"], ["ht"], "swap_heads", perm=[0, 2, 1]),
           oh.make_node("Reshape", ["ht", "joined"], ["a2"], "join_heads")] if heads else []),
        oh.make_node("Gemm", ["a2" if heads else "a", "w3", "b3"], ["y"], "fc", transB=1),
    ]
    graph = oh.make_graph(nodes, "quant_sample",
                          [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, INPUT_SHAPE)],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 10])],
                          inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def feeds(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).normal(0, 1, INPUT_SHAPE).astype(np.float32)}


class _Reader:
    """Calibration data: a few random inputs (onnxruntime's CalibrationDataReader protocol)."""

    def __init__(self) -> None:
        self._feeds: Iterator[dict[str, np.ndarray]] = iter([feeds(s) for s in range(8)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)

    def rewind(self) -> None:
        self._feeds = iter([feeds(s) for s in range(8)])


def quantized(tmp: Path, form: str, reduce_range: bool = True, residual: bool = False,
              computed_flatten: bool = False, product: bool = False, heads: bool = False,
              pool: bool = False) -> Path:
    """``form`` in qdq | qoperator | dynamic; the path of the quantized model.

    ``reduce_range`` quantizes weights to 7 bits: onnxruntime's AVX2 u8 x s8 kernel adds pairs
    of products in saturating int16 (``vpmaddubsw``), so with full-range weights its own
    results are off on hosts without VNNI; with 7-bit weights nothing saturates and its
    integer results are exact, which is what the comparisons need.
    """
    from onnxruntime.quantization import (
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    stem = (form + ("-residual" if residual else "") + ("-computed" if computed_flatten else "")
            + ("-product" if product else "") + ("-heads" if heads else "")
            + ("-pool" if pool else ""))
    source, target = tmp / f"float-{stem}.onnx", tmp / f"{stem}.onnx"
    onnx.save(float_model(residual=residual, computed_flatten=computed_flatten,
                          product=product, heads=heads, pool=pool), source)
    if form == "dynamic":
        quantize_dynamic(source, target, weight_type=QuantType.QInt8,
                         reduce_range=reduce_range)
        return target
    reader = _Reader()
    quantize_static(source, target, reader,
                    quant_format=QuantFormat.QDQ if form == "qdq" else QuantFormat.QOperator,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    per_channel=True, reduce_range=reduce_range)
    return target
