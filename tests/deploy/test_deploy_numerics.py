"""Outputs of ``tuner run``'s executor match onnxruntime: fused patterns, the numpy operators,
and (slow) the three sample models."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import helper

from tests.deploy.conftest import RunModel, assert_close, make_model

RNG = np.random.default_rng(7)


def _w(*shape: int, scale: float = 0.3) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _bn(prefix: str, channels: int) -> dict[str, np.ndarray]:
    return {f"{prefix}.s": RNG.uniform(0.5, 1.5, channels).astype(np.float32),
            f"{prefix}.b": _w(channels), f"{prefix}.m": _w(channels),
            f"{prefix}.v": RNG.uniform(0.5, 1.5, channels).astype(np.float32)}


def _bn_node(x: str, prefix: str, out: str) -> Any:
    return helper.make_node("BatchNormalization", [x, *(f"{prefix}.{k}" for k in "sbmv")],
                            [out], name=f"{prefix}")


def residual_block() -> Any:
    """Conv -> BN -> Relu -> Conv(bias) -> Add(skip) -> Relu: every fusable pattern at once."""
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        _bn_node("c1", "bn1", "b1"),
        helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "bias2"], ["c2"], name="conv2",
                         pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "x"], ["sum"], name="add"),
        helper.make_node("Relu", ["sum"], ["y"], name="relu2"),
    ]
    weights = {"w1": _w(8, 8, 3, 3), "w2": _w(8, 8, 3, 3), "bias2": _w(8), **_bn("bn1", 8)}
    return make_model(nodes, {"x": (1, 8, 6, 6)}, {"y": (1, 8, 6, 6)}, weights)


def depthwise_relu6() -> Any:
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="dw", group=8, strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        _bn_node("c", "bn", "b"),
        helper.make_node("Clip", ["b", "lo", "hi"], ["y"], name="relu6"),
    ]
    weights = {"w": _w(8, 1, 3, 3), "lo": np.array(0, np.float32),
               "hi": np.array(6, np.float32), **_bn("bn", 8)}
    return make_model(nodes, {"x": (1, 8, 16, 16)}, {"y": None}, weights)


def gemm_head() -> Any:
    """Flatten -> Gemm(transB, bias) -> Relu -> MatMul + Add (a Linear as torch exports it)."""
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["p"], name="gap"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w1", "b1"], ["g"], name="fc1", transB=1),
        helper.make_node("Relu", ["g"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["m"], name="fc2"),
        helper.make_node("Add", ["m", "b2"], ["y"], name="fc2.bias"),
    ]
    weights = {"w1": _w(32, 16), "b1": _w(32), "w2": _w(32, 10), "b2": _w(10)}
    return make_model(nodes, {"x": (2, 16, 5, 5)}, {"y": (2, 10)}, weights)


def attention() -> Any:
    """Batched MatMul of two activations, scaled softmax, LayerNormalization."""
    nodes = [
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
        helper.make_node("Mul", ["s", "scale"], ["ss"], name="scaled"),
        helper.make_node("Softmax", ["ss"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["c"], name="context"),
        helper.make_node("LayerNormalization", ["c", "g", "beta"], ["y"], name="norm",
                         axis=-1, epsilon=1e-5),
    ]
    weights = {"scale": np.array(0.125, np.float32), "g": _w(16) + 1, "beta": _w(16)}
    inputs = {"q": (2, 8, 16), "kt": (2, 16, 8), "v": (2, 8, 16)}
    return make_model(nodes, inputs, {"y": (2, 8, 16)}, weights)


@pytest.mark.parametrize("build", [residual_block, depthwise_relu6, gemm_head, attention])
def test_fused_patterns_match_onnxruntime(run_model: RunModel, build: Any) -> None:
    got, want = run_model(build())
    assert_close(got, want)


@pytest.mark.parametrize("threads", [1, 2])
def test_thread_count_does_not_change_results(run_model: RunModel, threads: int) -> None:
    got, want = run_model(residual_block(), threads=threads)
    assert_close(got, want)


def _single(op: str, x_shape: tuple[int, ...], extra: dict[str, np.ndarray] | None = None,
            opset: int = 17, **attrs: Any) -> Any:
    extra = extra or {}
    node = helper.make_node(op, ["x", *extra], ["y"], name=f"the_{op.lower()}", **attrs)
    return make_model([node], {"x": x_shape}, {"y": None}, extra, opset=opset)


NUMPY_OPS = [
    _single("MaxPool", (1, 3, 11, 11), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    _single("MaxPool", (1, 3, 10, 10), kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    _single("MaxPool", (1, 2, 9, 9), kernel_shape=[3, 3], dilations=[2, 2], pads=[1, 0, 2, 1]),
    _single("AveragePool", (1, 3, 9, 9), kernel_shape=[3, 3], strides=[2, 2],
            pads=[1, 1, 1, 1]),
    _single("AveragePool", (1, 3, 9, 9), kernel_shape=[2, 2], pads=[1, 1, 0, 0],
            count_include_pad=1),
    _single("GlobalMaxPool", (1, 4, 5, 5)),
    _single("Softmax", (2, 3, 4), axis=1),
    _single("Softmax", (2, 3, 4), opset=11, axis=1),
    _single("LogSoftmax", (2, 5)),
    _single("Erf", (4, 7)),
    _single("Sigmoid", (4, 7)),
    _single("HardSwish", (4, 7)),
    _single("LeakyRelu", (4, 7), alpha=0.2),
    _single("Transpose", (2, 3, 4), perm=[2, 0, 1]),
    _single("ReduceMean", (2, 3, 4), extra={"axes": np.array([1], np.int64)}, opset=18),
    _single("ReduceSum", (2, 3, 4), extra={"axes": np.array([-1], np.int64)}, keepdims=0),
    _single("Pad", (1, 2, 3, 3), extra={"pads": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)}),
    _single("Slice", (4, 6), extra={"starts": np.array([1, 0], np.int64),
                                    "ends": np.array([3, 6], np.int64),
                                    "axes": np.array([0, 1], np.int64),
                                    "steps": np.array([1, 2], np.int64)}),
    _single("Gather", (5, 3), extra={"idx": np.array([4, 0, -1], np.int64)}, axis=0),
    _single("Unsqueeze", (3, 4), extra={"axes": np.array([0, -1], np.int64)}),
    _single("Conv", (1, 4, 6, 6), extra={"w": np.ones((4, 2, 3, 3), np.float32)}, group=2,
            auto_pad="SAME_UPPER"),
    _single("Gemm", (3, 4), extra={"b": np.ones((5, 4), np.float32)}, transB=1, alpha=0.5),
]


@pytest.mark.parametrize("model", NUMPY_OPS, ids=lambda m: m.graph.node[0].name)
def test_numpy_operators_match_onnxruntime(run_model: RunModel, model: Any) -> None:
    got, want = run_model(model)
    assert_close(got, want, rtol=1e-5)


def test_shape_subgraphs_are_folded(run_model: RunModel) -> None:
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as exporters write a flatten."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], name="gather", axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes"], ["b1"], name="unsqueeze"),
        helper.make_node("Concat", ["b1", "minus_one"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape"),
    ]
    weights = {"zero": np.array(0, np.int64), "axes": np.array([0], np.int64),
               "minus_one": np.array([-1], np.int64)}
    model = make_model(nodes, {"x": (2, 3, 4)}, {"y": (2, 12)}, weights)
    got, want = run_model(model)
    assert_close(got, want)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "bert_block"])
def test_sample_models_match_onnxruntime(run_model: RunModel, name: str) -> None:
    from tuner_service.compiler.frontend.samples import build_sample_model

    got, want = run_model(build_sample_model(name))
    assert_close(got, want, rtol=1e-3)
