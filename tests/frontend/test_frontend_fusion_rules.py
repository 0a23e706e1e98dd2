"""When the layer plan fuses a node and when it must not, on small hand-built graphs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from fusion_support import check_plan  # noqa: E402
from onnx import helper  # noqa: E402

from tuner_service.compiler.frontend.extract import extract_tasks  # noqa: E402
from tuner_service.compiler.frontend.fusion import plan_layers  # noqa: E402

RNG = np.random.default_rng(5)
X = (1, 4, 6, 6)  # conv input; the 3x3 conv with padding keeps 6x6 and makes 8 channels
Y = (1, 8, 6, 6)


def _rand(*shape: int) -> np.ndarray:
    return np.asarray(RNG.standard_normal(shape), dtype=np.float32)


def _conv(out: str = "c", data: str = "x", weight: str = "w", name: str = "conv") -> Any:
    return helper.make_node("Conv", [data, weight], [out], name, pads=[1, 1, 1, 1])


def _node(op: str, inputs: list[str], out: str, **attrs: Any) -> Any:
    return helper.make_node(op, inputs, [out], out, **attrs)


def _plan(tiny_model: Any, nodes: list[Any], outputs: dict[str, Any], weights: dict[str, Any],
          inputs: dict[str, Any] | None = None, opset: int = 17, check: bool = True) -> Any:
    model = tiny_model(nodes, inputs or {"x": X}, outputs, {"w": _rand(8, 4, 3, 3), **weights},
                       opset=opset)
    if not check:
        return model, plan_layers(model)
    feeds = {name: _rand(*shape) for name, shape in (inputs or {"x": X}).items()}
    return model, check_plan(model, feeds, compile_kernels=True)


def _fused(layers: Any) -> list[tuple[tuple[str, ...], str]]:
    return [(layer.nodes, str(layer.workload.epilogue_spec)) for layer in layers]


def test_scale_and_shift_constants_fold_before_the_residual(tiny_model: Any) -> None:
    nodes = [_conv(), _node("Mul", ["c", "m"], "mul"), _node("Div", ["mul", "d"], "div"),
             _node("Sub", ["div", "s"], "sub"), _node("Add", ["a", "sub"], "add"),
             _node("Add", ["add", "x8"], "res"), _node("Relu", ["res"], "out")]
    weights = {"m": _rand(1, 8, 1, 1), "d": _rand(8, 1, 1) + 3, "s": _rand(8, 1, 1),
               "a": _rand(1, 8, 1, 1)}
    _, layers = _plan(tiny_model, nodes, {"out": None}, weights, {"x": X, "x8": Y})
    assert _fused(layers) == [(("conv", "mul", "div", "sub", "add", "res", "out"),
                               "scale+bias+residual+relu")]
    assert layers[0].inputs["residual"] == "x8"


def test_scaling_after_the_residual_is_not_fused(tiny_model: Any) -> None:
    nodes = [_conv(), _node("Add", ["c", "x8"], "res"), _node("Mul", ["res", "m"], "out")]
    _, layers = _plan(tiny_model, nodes, {"out": None}, {"m": _rand(1, 8, 1, 1)},
                      {"x": X, "x8": Y})
    assert _fused(layers) == [(("conv", "res"), "residual")]


@pytest.mark.parametrize("outputs", [{"c": None, "out": None}, {"out": None, "other": None}])
def test_shared_or_exported_intermediate_is_not_fused(tiny_model: Any, outputs: Any) -> None:
    nodes = [_conv(), _node("Relu", ["c"], "out")]
    if "other" in outputs:
        nodes.append(_node("Sigmoid", ["c"], "other"))
    _, layers = _plan(tiny_model, nodes, outputs, {})
    assert _fused(layers) == [(("conv",), "none")]


def test_add_of_a_tensor_to_itself_is_not_fused(tiny_model: Any) -> None:
    _, layers = _plan(tiny_model, [_conv(), _node("Add", ["c", "c"], "out")], {"out": None}, {})
    assert _fused(layers) == [(("conv",), "none")]


def test_residual_goes_to_the_anchor_that_runs_second(tiny_model: Any) -> None:
    nodes = [_conv("c1", name="conv1"), _node("Relu", ["c1"], "r1"),
             _conv("c2", name="conv2", weight="w2"), _node("Add", ["r1", "c2"], "sum"),
             _node("Relu", ["sum"], "out")]
    _, layers = _plan(tiny_model, nodes, {"out": None}, {"w2": _rand(8, 4, 3, 3)})
    assert _fused(layers) == [(("conv1", "r1"), "relu"),
                              (("conv2", "sum", "out"), "residual+relu")]


def test_residual_computed_after_the_anchor_is_not_fused(tiny_model: Any) -> None:
    # conv1's Add reads conv2's output, which only exists after conv1 ran: not conv1's residual
    nodes = [_conv("c1", name="conv1"), _conv("c2", name="conv2", weight="w2"),
             _node("Sigmoid", ["c2"], "s2"), _node("Add", ["c1", "s2"], "out")]
    _, layers = _plan(tiny_model, nodes, {"out": None}, {"w2": _rand(8, 4, 3, 3)})
    assert _fused(layers) == [(("conv1",), "none"), (("conv2", "s2"), "sigmoid")]


@pytest.mark.parametrize("shape, epilogue", [
    ((1, 1, 6, 8), "residual"),  # broadcasts, but not per channel: a constant residual
    ((8,), "residual"),  # numpy broadcasting puts (8,) on the width, not on the channels
    ((8, 1, 1), "bias"),
    ((1, 8, 1, 1), "bias"),
    ((2, 8, 6, 8), "none"),  # would grow the output
])
def test_constant_add_broadcasting(tiny_model: Any, shape: tuple[int, ...], epilogue: str
                                   ) -> None:
    nodes = [_conv(), _node("Add", ["c", "k"], "out")]
    _, layers = _plan(tiny_model, nodes, {"out": None}, {"k": _rand(*shape)},
                      {"x": (1, 4, 6, 8)})
    assert [str(layer.workload.epilogue_spec) for layer in layers] == [epilogue]
    if epilogue == "residual":
        assert layers[0].constants["residual"].shape == (1, 8, 6, 8)


def test_clip_bounds_must_be_constant(tiny_model: Any) -> None:
    nodes = [_conv(), _node("Clip", ["c", "low", "high"], "out")]
    _, layers = _plan(tiny_model, nodes, {"out": None}, {"high": np.array(2.0, np.float32)},
                      {"x": X, "low": ()})
    assert _fused(layers) == [(("conv",), "none")]


@pytest.mark.parametrize("opset, attrs, inputs, epilogue", [
    (10, {"min": -1.0, "max": 0.5}, [], "clip(-1:0.5)"),
    (10, {"max": 6.0}, [], "clip(-inf:6)"),
    (17, {}, ["zero", ""], "relu"),
    (17, {}, ["zero", "six"], "relu6"),
])
def test_clip_forms(tiny_model: Any, opset: int, attrs: Any, inputs: Any, epilogue: str
                    ) -> None:
    nodes = [_conv(), _node("Clip", ["c", *inputs], "out", **attrs)]
    weights = {"zero": np.array(0.0, np.float32), "six": np.array(6.0, np.float32)}
    _, layers = _plan(tiny_model, nodes, {"out": None}, weights, opset=opset)
    assert [str(layer.workload.epilogue_spec) for layer in layers] == [epilogue]


def test_batch_norm_needs_constant_parameters(tiny_model: Any) -> None:
    nodes = [_conv(), _node("BatchNormalization", ["c", "g", "b", "m", "v"], "out")]
    weights = {"g": _rand(8), "b": _rand(8), "m": _rand(8)}
    _, layers = _plan(tiny_model, nodes, {"out": None}, weights,
                      {"x": X, "v": (8,)}, check=False)
    assert _fused(layers) == [(("conv",), "none")]


def test_only_one_activation(tiny_model: Any) -> None:
    nodes = [_conv(), _node("Relu", ["c"], "r"), _node("Relu", ["r"], "out")]
    _, layers = _plan(tiny_model, nodes, {"out": None}, {})
    assert _fused(layers) == [(("conv", "r"), "relu")]


@pytest.mark.parametrize("c_shape, c_const, epilogue", [
    ((16,), True, "bias+relu"),
    ((1, 16), True, "bias+relu"),
    ((5, 1), True, "residual+relu"),  # per row: broadcast into a constant residual
    ((5, 16), False, "residual+relu"),  # an activation C of the output's shape
])
def test_gemm_with_alpha_beta_and_c(tiny_model: Any, c_shape: Any, c_const: bool,
                                    epilogue: str) -> None:
    gemm = helper.make_node("Gemm", ["a", "bw", "cc"], ["g"], "gemm", alpha=0.5,
                            beta=2.0 if c_const else 1.0)
    model = tiny_model([gemm, _node("Relu", ["g"], "out")],
                       {"a": (5, 12), **({} if c_const else {"cc": c_shape})}, {"out": None},
                       {"bw": _rand(12, 16), **({"cc": _rand(*c_shape)} if c_const else {})})
    feeds = {"a": _rand(5, 12), **({} if c_const else {"cc": _rand(*c_shape)})}
    (layer,) = check_plan(model, feeds, compile_kernels=True)
    assert str(layer.workload.epilogue_spec) == epilogue
    assert layer.constants["weight"].shape == (16, 12)  # transB=0: transposed, times alpha


def test_gemm_of_two_activations_with_bias_gets_no_layer(tiny_model: Any) -> None:
    gemm = helper.make_node("Gemm", ["a", "b", "cc"], ["out"], "gemm")
    model = tiny_model([gemm], {"a": (5, 12), "b": (12, 16)}, {"out": None},
                       {"cc": _rand(16)})
    assert plan_layers(model) == []
    # still a task: tuning the product is worth it, the runtime adds the bias itself
    assert [t.workload.key for t in extract_tasks(model).tasks] == [
        "batch_matmul:B=1,M=5,N=16,K=12"]


def test_matmul_epilogue_on_the_last_axis(tiny_model: Any) -> None:
    nodes = [_node("MatMul", ["a", "bw"], "mm"), _node("Add", ["k", "mm"], "add"),
             _node("Relu", ["add"], "out")]
    model = tiny_model(nodes, {"a": (2, 3, 12)}, {"out": None},
                       {"bw": _rand(12, 16), "k": _rand(1, 1, 16)})
    (layer,) = check_plan(model, {"a": _rand(2, 3, 12)}, compile_kernels=True)
    assert layer.workload.key == "dense:M=6,N=16,K=12,epilogue=bias+relu"
