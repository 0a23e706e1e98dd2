"""Operators without a numpy implementation run in onnx's reference evaluator: the model is not
refused, the result matches onnxruntime, and a warning names the operator and its share of the
run time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import helper

from tests.deploy.conftest import assert_close, make_model, onnxruntime_outputs
from tuner_service.compiler.deploy.configs import ConfigBook
from tuner_service.compiler.deploy.executor import OPS, ModelRunner
from tuner_service.compiler.deploy.library import build_library
from tuner_service.compiler.deploy.loader import KernelLibrary


def _conv_then(op: str, **attrs: Any) -> Any:
    """Conv (a kernel) -> ``op`` (no numpy implementation) -> Relu (numpy)."""
    rng = np.random.default_rng(5)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node(op, ["c"], ["h"], name=f"the_{op.lower()}", **attrs),
        helper.make_node("Relu", ["h"], ["y"], name="relu"),
    ]
    weights = {"w": rng.standard_normal((6, 3, 3, 3)).astype(np.float32)}
    return make_model(nodes, {"x": (1, 3, 7, 5)}, {"y": (1, 6, 7, 5)}, weights)


def test_the_ops_used_here_really_lack_a_numpy_implementation() -> None:
    assert "Hardmax" not in OPS and "Shrink" not in OPS


@pytest.mark.parametrize(("op", "attrs"), [("Hardmax", {"axis": 1}),
                                           ("Shrink", {"bias": 0.5, "lambd": 0.7})])
def test_missing_operator_runs_in_the_reference_evaluator(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, op: str, attrs: dict[str, Any]
        ) -> None:
    model = _conv_then(op, **attrs)
    build_library(model, ConfigBook(), tmp_path)
    with caplog.at_level("WARNING", logger="tuner_service.compiler.deploy"):
        runner = ModelRunner(model, KernelLibrary(tmp_path))
    assert f"operator {op}" in caplog.text and f"the_{op.lower()}" in caplog.text
    assert "reference evaluator" in caplog.text
    for seed in (0, 1):
        feeds = runner.random_feeds(seed)
        assert_close(runner.run(feeds), onnxruntime_outputs(model, feeds), rtol=1e-5)
    [row] = runner.fallback_report()
    assert row["op"] == op and row["nodes"] == 1 and 0 < row["share"] <= 1
    kinds = {p["step"].split(" ")[0]: p["kind"] for p in runner.profile(runner.random_feeds(), 1)}
    assert kinds[f"the_{op.lower()}"] == "reference"


def test_a_constant_input_to_a_fallback_operator_is_folded_at_load(tmp_path: Path) -> None:
    nodes = [helper.make_node("Hardmax", ["table"], ["mask"], name="const_hardmax", axis=0),
             helper.make_node("Mul", ["x", "mask"], ["y"], name="mul")]
    table = np.arange(12, dtype=np.float32).reshape(3, 4)
    model = make_model(nodes, {"x": (3, 4)}, {"y": (3, 4)}, {"table": table})
    build_library(model, ConfigBook(), tmp_path)
    runner = ModelRunner(model, KernelLibrary(tmp_path))
    assert runner.fallback_report() == []  # it ran once, at load: nothing at run time
    feeds = runner.random_feeds()
    assert_close(runner.run(feeds), onnxruntime_outputs(model, feeds), rtol=1e-6)


def test_tuner_run_warns_with_the_operator_and_its_share(tmp_path: Path) -> None:
    from tuner_service.cli.main import main

    model = tmp_path / "model.onnx"
    model.write_bytes(_conv_then("Hardmax", axis=-1).SerializeToString())
    assert main(["build", str(model), "-o", str(tmp_path / "lib")]) == 0
    done = subprocess.run(
        [sys.executable, "-m", "tuner_service.cli.main", "run", str(model), "--library",
         str(tmp_path / "lib"), "--iterations", "2", "--check", "--json"],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    [row] = report["reference_evaluator"]
    assert row["op"] == "Hardmax" and 0 < row["share"] <= 1
    assert report["check"]["max_rel_error"] < 1e-5
    assert "Hardmax" in done.stderr and "% of the run time" in done.stderr


def test_a_subgraph_reading_the_enclosing_graph_gets_its_tensors(tmp_path: Path) -> None:
    """If (no numpy implementation) whose branches read ``x`` and ``w`` from the outer graph."""
    from onnx import TensorProto

    def branch(name: str, op: str) -> Any:
        return helper.make_graph(
            [helper.make_node(op, ["x", "w"], [f"{name}_out"], name=f"{name}_op")], name, [],
            [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [3, 4])])

    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], name="total", keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["positive"], name="positive"),
        helper.make_node("If", ["positive"], ["y"], name="branchy",
                         then_branch=branch("then", "Add"), else_branch=branch("else", "Mul")),
    ]
    weights = {"zero": np.array(0, np.float32),
               "w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)}
    model = make_model(nodes, {"x": (3, 4)}, {"y": (3, 4)}, weights)
    build_library(model, ConfigBook(), tmp_path)
    runner = ModelRunner(model, KernelLibrary(tmp_path))
    for sign in (1.0, -1.0):
        feeds = {"x": np.abs(runner.random_feeds()["x"]) * np.float32(sign)}
        assert_close(runner.run(feeds), onnxruntime_outputs(model, feeds), rtol=1e-6)
