"""Activations absorbed into fused epilogues: single nodes, the SiLU and erf-GELU patterns
exporters write, and graphs where fusing would be wrong; each plan is checked layer by layer
against onnxruntime, and the whole model through the deploy build-and-run path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from fusion_support import check_plan  # noqa: E402
from onnx import helper  # noqa: E402

from tuner_service.compiler.deploy.configs import ConfigBook  # noqa: E402
from tuner_service.compiler.deploy.executor import ModelRunner  # noqa: E402
from tuner_service.compiler.deploy.library import build_library  # noqa: E402
from tuner_service.compiler.deploy.loader import KernelLibrary  # noqa: E402
from tuner_service.compiler.frontend.extract import extract_tasks  # noqa: E402

RNG = np.random.default_rng(11)
X = (1, 4, 6, 6)
SQRT2 = np.array(1.4142135, np.float32)


def _rand(*shape: int, scale: float = 1.0) -> np.ndarray:
    return np.asarray(RNG.standard_normal(shape) * scale, dtype=np.float32)


def _node(op: str, inputs: list[str], out: str, **attrs: Any) -> Any:
    return helper.make_node(op, inputs, [out], out, **attrs)


def _conv(out: str = "c") -> list[Any]:
    return [helper.make_node("Conv", ["x", "w", "cb"], [out], "conv", pads=[1, 1, 1, 1])]


def _dense(out: str = "d") -> list[Any]:
    return [_node("MatMul", ["x2", "wm"], "mm"), _node("Add", ["mm", "bm"], out)]


WEIGHTS = {"w": _rand(8, 4, 3, 3, scale=0.5), "cb": _rand(8), "wm": _rand(12, 16, scale=0.4),
           "bm": _rand(16), "sqrt2": SQRT2, "rsqrt2": np.array(0.70710677, np.float32),
           "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32),
           "two": np.array(2.0, np.float32), "almost_one": np.array(0.99, np.float32)}


def _model(tiny_model: Any, nodes: list[Any], outputs: list[str], opset: int = 17) -> Any:
    used = {name for n in nodes for name in n.input}
    weights = {k: v for k, v in WEIGHTS.items() if k in used}
    inputs = {"x": X} if "x" in used else {"x2": (5, 12)}
    return tiny_model(nodes, inputs, dict.fromkeys(outputs), weights, opset=opset)


def _gelu(x: str, y: str, *, mul_form: bool = False, swap: bool = False) -> list[Any]:
    first = (_node("Mul", ["rsqrt2", x] if swap else [x, "rsqrt2"], f"{y}.s") if mul_form
             else _node("Div", [x, "sqrt2"], f"{y}.s"))
    return [first, _node("Erf", [f"{y}.s"], f"{y}.e"),
            _node("Add", ["one", f"{y}.e"] if swap else [f"{y}.e", "one"], f"{y}.a"),
            _node("Mul", [f"{y}.a", x] if swap else [x, f"{y}.a"], f"{y}.m"),
            _node("Mul", ["half", f"{y}.m"] if swap else [f"{y}.m", "half"], y)]


def _gelu_half_first(x: str, y: str, half: str = "half") -> list[Any]:
    """``x * 0.5 * (1 + erf(x / sqrt 2))`` as a Python GELU exports."""
    return [_node("Mul", [x, half], f"{y}.h"), _node("Div", [x, "sqrt2"], f"{y}.s"),
            _node("Erf", [f"{y}.s"], f"{y}.e"), _node("Add", [f"{y}.e", "one"], f"{y}.a"),
            _node("Mul", [f"{y}.a", f"{y}.h"], y)]


def _silu(x: str, y: str, swap: bool = False) -> list[Any]:
    return [_node("Sigmoid", [x], f"{y}.s"),
            _node("Mul", [f"{y}.s", x] if swap else [x, f"{y}.s"], y)]


def _bn(x: str, y: str) -> list[Any]:
    return [helper.make_node("BatchNormalization", [x, "bn.s", "bn.b", "bn.m", "bn.v"], [y], y)]


WEIGHTS.update({"bn.s": np.linspace(0.5, 1.5, 8, dtype=np.float32), "bn.b": _rand(8),
                "bn.m": _rand(8), "bn.v": np.linspace(0.6, 1.4, 8, dtype=np.float32)})

FUSED = {
    "sigmoid": ([*_conv(), _node("Sigmoid", ["c"], "y")], 17, "bias+sigmoid"),
    "hardsigmoid_torch": (_conv() + _bn("c", "b") + [
        _node("HardSigmoid", ["b"], "y", alpha=1 / 6, beta=0.5)], 17,
        "scale+bias+hardsigmoid(0.16666667:0.5)"),
    "hardsigmoid_onnx": ([*_dense(), _node("HardSigmoid", ["d"], "y")], 17,
                         "bias+hardsigmoid(0.2:0.5)"),
    "hardswish": ([*_conv(), _node("HardSwish", ["c"], "y")], 17, "bias+hardswish"),
    "tanh": ([*_dense(), _node("Tanh", ["d"], "y")], 17, "bias+tanh"),
    "gelu_node": ([*_dense(), _node("Gelu", ["d"], "y")], 20, "bias+gelu"),
    "gelu_node_conv": ([*_conv(), _node("Gelu", ["c"], "y")], 20, "bias+gelu"),
    "silu": (_conv() + _bn("c", "b") + _silu("b", "y"), 17, "scale+bias+silu"),
    "silu_swapped": (_conv() + _silu("c", "y", swap=True), 17, "bias+silu"),
    "silu_dense": (_dense() + _silu("d", "y"), 17, "bias+silu"),
    "gelu_div": (_dense() + _gelu("d", "y"), 17, "bias+gelu"),
    "gelu_mul_swapped": (_dense() + _gelu("d", "y", mul_form=True, swap=True), 17,
                         "bias+gelu"),
    "gelu_half_first": ([*_dense(), *_gelu_half_first("d", "y")], 17, "bias+gelu"),
    "gelu_conv": (_conv() + _gelu("c", "y", mul_form=True), 17, "bias+gelu"),
}


@pytest.mark.parametrize("case", sorted(FUSED))
def test_activations_are_fused(tiny_model: Any, tmp_path: Path, case: str) -> None:
    nodes, opset, epilogue = FUSED[case]
    model = _model(tiny_model, nodes, ["y"], opset)
    layers = _check_layers(model)
    assert [(layer.nodes, str(layer.workload.epilogue_spec)) for layer in layers] == [
        (tuple(n.name for n in nodes), epilogue)]
    assert layers[0].output == "y"
    _check_deploy(model, tmp_path)


def _not_fused() -> dict[str, tuple[list[Any], list[str], int, str]]:
    """Graphs where the activation must stay outside the kernel: (nodes, outputs, opset,
    the epilogue the anchor's layer gets)."""
    silu = _conv() + _silu("c", "y")
    gelu = _dense() + _gelu("d", "y")
    return {
        # the conv output has a third reader outside the pattern
        "silu_extra_reader": ([*silu, _node("Relu", ["c"], "z")], ["y", "z"], 17, "bias"),
        # the sigmoid's output is a graph output too
        "silu_middle_output": (silu, ["y", "y.s"], 17, "bias"),
        # Mul(x, sigmoid(other)) is not SiLU
        "silu_other_operand": ([*_conv(), _node("Relu", ["c"], "r"),
                                _node("Sigmoid", ["r"], "s"), _node("Mul", ["c", "s"], "y")],
                               ["y"], 17, "bias"),
        "gelu_middle_output": (gelu, ["y", "y.e"], 17, "bias"),
        "gelu_wrong_divisor": ([n if n.op_type != "Div" else _node("Div", ["d", "two"], "y.s")
                                for n in gelu], ["y"], 17, "bias"),
        "gelu_wrong_one": ([n if n.name != "y.a" else _node("Add", ["y.e", "almost_one"], "y.a")
                            for n in gelu], ["y"], 17, "bias"),
        "gelu_half_first_wrong_half": ([*_dense(), *_gelu_half_first("d", "y", "almost_one")],
                                       ["y"], 17, "bias"),
        "gelu_extra_reader": ([*gelu, _node("Tanh", ["y.a"], "z")], ["y", "z"], 17, "bias"),
        "gelu_tanh_approximation": ([*_dense(), _node("Gelu", ["d"], "y", approximate="tanh")],
                                    ["y"], 20, "bias"),
    }


NOT_FUSED = _not_fused()


@pytest.mark.parametrize("case", sorted(NOT_FUSED))
def test_counter_examples_are_not_fused(tiny_model: Any, tmp_path: Path, case: str) -> None:
    nodes, outputs, opset, epilogue = NOT_FUSED[case]
    model = _model(tiny_model, nodes, outputs, opset)
    anchor_chain = ("conv",) if nodes[0].name == "conv" else ("mm", "d")
    layers = _check_layers(model)
    assert [(layer.nodes, str(layer.workload.epilogue_spec)) for layer in layers] == [
        (anchor_chain, epilogue)]
    _check_deploy(model, tmp_path)


def test_activation_keeps_the_base_workload(tiny_model: Any) -> None:
    model = _model(tiny_model, _conv() + _silu("c", "y"), ["y"])
    (task,) = extract_tasks(model).tasks
    assert task.workload.base_key == "conv2d:N=1,C=4,H=6,W=6,K=8,R=3,S=3,pad=1"
    assert set(task.variants) == {f"{task.workload.base_key},epilogue=bias+silu"}


def _check_layers(model: Any) -> Any:
    feeds = {i.name: _rand(*[d.dim_value for d in i.type.tensor_type.shape.dim])
             for i in model.graph.input}
    return check_plan(model, feeds, compile_kernels=True)


def _check_deploy(model: Any, tmp_path: Path) -> None:
    """The built library, run by ``ModelRunner``, against onnxruntime to 1e-5 relative."""
    out = tmp_path / "lib"
    build_library(model, ConfigBook(), out)
    runner = ModelRunner(model, KernelLibrary(out), 1)
    feeds = runner.random_feeds(0)
    got = runner.run(feeds)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    want = dict(zip(names, session.run(None, feeds), strict=True))
    for name, expected in want.items():
        scale = max(1.0, float(np.abs(expected).max()))
        error = float(np.abs(got[name].reshape(expected.shape) - expected).max())
        assert error <= 1e-5 * scale, f"{name}: max abs error {error} (scale {scale})"


@pytest.mark.parametrize("name, epilogue", [
    ("SiLU", "bias+silu"), ("GELU", "bias+gelu"), ("Hardswish", "bias+hardswish"),
    ("Hardsigmoid", "bias+hardsigmoid(0.16666667:0.5)"), ("Sigmoid", "bias+sigmoid"),
    ("Tanh", "bias+tanh"),
])
def test_what_torch_exports_is_fused(name: str, epilogue: str) -> None:
    """The patterns as ``torch.onnx.export`` (TorchScript exporter, opset 17) writes them."""
    import io
    import warnings

    torch = pytest.importorskip("torch")
    act = getattr(torch.nn, name)
    module = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, padding=1), act(),
                                 torch.nn.Flatten(), torch.nn.Linear(8 * 36, 16), act())
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (torch.zeros(1, 4, 6, 6),), buffer, dynamo=False,
                          opset_version=17)
    keys = sorted(key for task in extract_tasks(buffer.getvalue()).tasks
                  for key in task.variants)
    assert keys == [f"conv2d:N=1,C=4,H=6,W=6,K=8,R=3,S=3,pad=1,epilogue={epilogue}",
                    f"dense:M=1,N=16,K=288,epilogue={epilogue}"]
