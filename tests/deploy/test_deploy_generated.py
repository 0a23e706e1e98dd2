"""Generated kernels in a model library: built, recorded, bound as kernel steps, and equal to
onnxruntime; libraries without them (built with ``generated=False`` or before they existed)
still run those nodes in numpy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import helper

from schedule_templates.ops.base import op_kinds
from tests.deploy.conftest import make_model, onnxruntime_outputs
from tuner_service.compiler.deploy.configs import ConfigBook
from tuner_service.compiler.deploy.errors import LibraryError
from tuner_service.compiler.deploy.executor import ModelRunner
from tuner_service.compiler.deploy.generated_step import GeneratedStep
from tuner_service.compiler.deploy.kernel_step import KernelStep
from tuner_service.compiler.deploy.library import build_library
from tuner_service.compiler.deploy.loader import KernelLibrary
from tuner_service.compiler.frontend.samples import build_sample_model


def needs(*kinds: str) -> None:
    missing = set(kinds) - set(op_kinds())
    if missing:
        pytest.skip(f"operator classes not implemented yet: {sorted(missing)}")


def build_and_run(model: Any, out: Path, generated: bool = True, threads: int = 1
                  ) -> tuple[ModelRunner, dict[str, np.ndarray], dict[str, np.ndarray]]:
    build_library(model, ConfigBook(), out, generated=generated)
    runner = ModelRunner(model, KernelLibrary(out), threads)
    feeds = runner.random_feeds(0)
    return runner, runner.run(feeds), onnxruntime_outputs(model, feeds)


def assert_relative(got: dict[str, np.ndarray], want: dict[str, np.ndarray],
                    rtol: float = 1e-5) -> None:
    for name, expected in want.items():
        scale = max(1e-6, float(np.max(np.abs(expected))))
        error = float(np.max(np.abs(got[name] - expected)))
        assert error <= rtol * scale, f"{name}: max abs error {error} (scale {scale})"


def step_kinds(runner: ModelRunner) -> dict[str, list[str]]:
    kinds: dict[str, list[str]] = {}
    for step in runner.steps:
        kind = ("generated" if isinstance(step, GeneratedStep) else
                "kernel" if isinstance(step, KernelStep) else step.info.op_type)
        kinds.setdefault(kind, []).append(getattr(step, "layer", ""))
    return kinds


def n(op: str, inputs: list[str], output: str, **attrs: Any) -> Any:
    return helper.make_node(op, inputs, [output], name=output, **attrs)


def every_op_model() -> Any:
    """A conv feeding every mapped operator (elementwise chains, batch norm, pooling,
    reductions, softmax, layer norm, concat, slice, split, gather, transpose)."""
    rng = np.random.default_rng(0)
    w = {"w": rng.standard_normal((8, 4, 3, 3)).astype(np.float32) * 0.3,
         "bias": rng.standard_normal((8, 1, 1)).astype(np.float32),
         "lo": np.array(-0.5, np.float32), "hi": np.array(2.0, np.float32),
         "three": np.array(3.0, np.float32), "one": np.array(1.0, np.float32),
         "g": rng.uniform(0.5, 1.5, 8).astype(np.float32),
         "b": rng.standard_normal(8).astype(np.float32),
         "m": rng.standard_normal(8).astype(np.float32) * 0.1,
         "v": rng.uniform(0.5, 1.5, 8).astype(np.float32),
         "lg": rng.uniform(0.5, 1.5, 8).astype(np.float32),
         "lb": rng.standard_normal(8).astype(np.float32),
         "st": np.array([1, 0], np.int64), "en": np.array([8, 9], np.int64),
         "ax": np.array([1, 3], np.int64), "sp": np.array([2, 3], np.int64),
         "sizes": np.array([3, 5], np.int64), "axes": np.array([2, 3], np.int64)}
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        n("Sigmoid", ["c"], "sig"), n("Mul", ["c", "sig"], "silu"),  # c has two readers
        helper.make_node("BatchNormalization", ["silu", "g", "b", "m", "v"], ["bn"],
                         name="bn"),
        n("Add", ["bn", "bias"], "biased"), n("Clip", ["biased", "lo", "hi"], "clip"),
        n("LeakyRelu", ["clip"], "leaky", alpha=0.1), n("HardSigmoid", ["leaky"], "hsig"),
        n("HardSwish", ["hsig"], "hswish"), n("Tanh", ["hswish"], "tanh"),
        n("Erf", ["tanh"], "erf"), n("Exp", ["erf"], "exp"), n("Log", ["exp"], "log"),
        n("Abs", ["log"], "abs"), n("Add", ["abs", "one"], "pos"), n("Sqrt", ["pos"], "sqrt"),
        n("Reciprocal", ["sqrt"], "recip"), n("Pow", ["recip", "three"], "pow"),
        n("Neg", ["pow"], "neg"), n("Floor", ["c"], "floor"), n("Max", ["neg", "floor"], "max"),
        n("Min", ["max", "c"], "min"), n("Sub", ["min", "c"], "sub"),
        n("Div", ["sub", "pos"], "e"),
        n("MaxPool", ["e"], "mp", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        n("AveragePool", ["e"], "ap", kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
        n("GlobalAveragePool", ["e"], "gap"),
        helper.make_node("ReduceSum", ["e", "axes"], ["rs"], name="rs", keepdims=1),
        n("Concat", ["gap", "rs"], "cat", axis=1),
        n("Transpose", ["e"], "tr", perm=[0, 2, 3, 1]),
        n("Softmax", ["tr"], "sm", axis=-1),
        helper.make_node("LayerNormalization", ["sm", "lg", "lb"], ["ln"], name="ln",
                         axis=-1),
        n("Slice", ["e", "st", "en", "ax", "sp"], "sl"),
        helper.make_node("Split", ["e", "sizes"], ["s0", "s1"], name="split", axis=1),
        n("ReduceMax", ["s1"], "rmax", axes=[1], keepdims=0),
        n("Gather", ["e", "at"], "gat", axis=3),
    ]
    w["at"] = np.array(-1, np.int64)
    outputs = dict.fromkeys(["mp", "ap", "cat", "ln", "sl", "s0", "rmax", "gat"])
    return make_model(nodes, {"x": (1, 4, 10, 9)}, outputs, w, opset=17)


def test_every_mapped_op_runs_generated_and_matches_onnxruntime(tmp_path: Path) -> None:
    needs("elementwise", "pool2d", "reduce", "softmax", "layernorm", "concat", "slice",
          "transpose")
    runner, got, want = build_and_run(every_op_model(), tmp_path)
    assert_relative(got, want)
    kinds = step_kinds(runner)
    assert set(kinds) == {"kernel", "generated"}, kinds  # not one numpy step
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    symbols = [g["symbol"] for g in manifest["generated"]]
    assert len(symbols) == len(set(symbols)) and all(s.startswith("g") for s in symbols)
    assert {e["op"] for e in manifest["generated_layers"]} >= {"elementwise", "pool2d"}
    profile = runner.profile(runner.random_feeds(1), iterations=1)
    assert {p["kind"] for p in profile} == {"kernel", "generated"}


def test_available_ops_match_onnxruntime(tmp_path: Path) -> None:
    """Whatever operator classes exist run generated; the rest stay numpy; same answer."""
    runner, got, want = build_and_run(every_op_model(), tmp_path, threads=2)
    assert_relative(got, want)
    assert "generated" in step_kinds(runner)


def test_gelu_and_legacy_softmax(tmp_path: Path) -> None:
    needs("elementwise", "softmax")
    nodes = [n("Gelu", ["x"], "a"), n("Gelu", ["x"], "b", approximate="tanh"),
             n("Add", ["a", "b"], "y"), n("Softmax", ["y"], "z", axis=-1)]
    model = make_model(nodes, {"x": (2, 3, 17)}, {"z": None}, opset=20)
    runner, got, want = build_and_run(model, tmp_path)
    assert_relative(got, want)
    assert list(step_kinds(runner)) == ["generated"]
    legacy = make_model([n("Softmax", ["x"], "z", axis=1)], {"x": (2, 3, 17)}, {"z": None},
                        opset=11)
    runner, got, want = build_and_run(legacy, tmp_path / "legacy")
    assert_relative(got, want)
    assert list(step_kinds(runner)) == ["generated"]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "numpy_left", "kinds"), [
    ("resnet18", {"Flatten"}, ("pool2d", "reduce")),
    ("mobilenet_v2", {"Flatten"}, ("reduce",)),
    ("bert_block", {"Reshape"}, ("elementwise", "softmax", "layernorm", "transpose"))])
def test_sample_models(name: str, numpy_left: set[str], kinds: tuple[str, ...],
                       tmp_path: Path) -> None:
    needs(*kinds)
    model = build_sample_model(name)
    runner, got, want = build_and_run(model, tmp_path)
    assert_relative(got, want)
    kinds = step_kinds(runner)
    assert set(kinds) - {"kernel", "generated"} == numpy_left, kinds


def test_library_without_generated_kernels_runs_numpy(tmp_path: Path) -> None:
    needs("elementwise")
    model = make_model([n("Relu", ["x"], "r"), n("Sigmoid", ["r"], "y")], {"x": (3, 5)},
                       {"y": None})
    runner, got, want = build_and_run(model, tmp_path, generated=False)
    assert "generated" not in json.loads((tmp_path / "manifest.json").read_text())
    assert_relative(got, want)
    assert set(step_kinds(runner)) == {"Relu", "Sigmoid"}
    runner, _, _ = build_and_run(model, tmp_path / "with")
    assert [s.layer for s in runner.steps if isinstance(s, GeneratedStep)] == ["r"]


def test_an_older_manifest_loads_and_runs_numpy(tmp_path: Path) -> None:
    needs("elementwise")
    model = make_model([n("Relu", ["x"], "y")], {"x": (3, 5)}, {"y": None})
    build_library(model, ConfigBook(), tmp_path)
    path = tmp_path / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["generated"], manifest["generated_layers"]
    path.write_text(json.dumps(manifest))
    runner = ModelRunner(model, KernelLibrary(tmp_path))
    assert set(step_kinds(runner)) == {"Relu"}


def test_a_library_for_another_plan_is_refused(tmp_path: Path) -> None:
    needs("elementwise")
    build_library(make_model([n("Relu", ["x"], "y")], {"x": (3, 5)}, {"y": None}),
                  ConfigBook(), tmp_path)
    other = make_model([n("Tanh", ["x"], "y")], {"x": (3, 5)}, {"y": None})
    with pytest.raises(LibraryError, match="rebuild"):
        ModelRunner(other, KernelLibrary(tmp_path))
