"""bench/layer_gap.py maps onnxruntime's profiled nodes back to ONNX nodes and lines them up
with our steps; run whole on a small model, its rows cover both runtimes' time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import layer_gap

from tests.deploy.conftest import make_model
from tuner_service.compiler.deploy.configs import ConfigBook
from tuner_service.compiler.deploy.library import build_library

ROOT = Path(__file__).resolve().parents[2]


def _graph() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    weights = {"w1": rng.standard_normal((16, 3, 3, 3)).astype(np.float32),
               "w2": rng.standard_normal((16, 16, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Sigmoid", ["a"], ["s"], name="sig"),
             helper.make_node("Mul", ["a", "s"], ["m"], name="silu"),
             helper.make_node("Conv", ["m", "w2"], ["y"], name="conv2")]
    return make_model(nodes, {"x": (1, 3, 40, 40)}, {"y": (1, 16, 40, 40)}, weights)


def test_onnxruntime_names_map_back_to_onnx_nodes() -> None:
    names = {"conv1", "sig", "silu", "conv2"}
    producers = {"a": "conv1", "s": "sig", "m": "silu", "y": "conv2"}
    assert layer_gap.onnx_node_of("conv2", names, producers) == "conv2"
    assert layer_gap.onnx_node_of("a_nchwc", names, producers) == "conv1"  # NCHWc form
    assert layer_gap.onnx_node_of("silu/QuickGeluFusion/", names, producers) == "silu"
    assert layer_gap.onnx_node_of("reorder_17", names, producers) is None


def test_rows_put_fused_nodes_on_the_step_that_runs_them() -> None:
    ours = [{"step": "conv1 [conv2d]", "kind": "kernel", "ms": 2.0,
             "nodes": ["conv1", "sig", "silu"]},
            {"step": "conv2 [conv2d]", "kind": "kernel", "ms": 1.0, "nodes": ["conv2"]}]
    ort = {"a_nchwc": {"ms": 1.0, "op": "Conv"},
           "silu/QuickGeluFusion/": {"ms": 0.5, "op": "QuickGelu"},
           "y_nchwc": {"ms": 1.5, "op": "Conv"},
           "ReorderOutput_3": {"ms": 0.25, "op": "ReorderOutput"},
           "mystery": {"ms": 0.125, "op": "Identity"}}
    report = layer_gap.compare(_graph(), ours, ort)
    rows = {row["step"]: row for row in report["rows"]}
    assert rows["conv1 [conv2d]"]["peer_ms"] == 1.5 and rows["conv1 [conv2d]"]["gap_ms"] == 0.5
    assert rows["conv2 [conv2d]"]["gap_ms"] == -0.5
    assert rows["onnxruntime layout reorders"]["peer_ms"] == 0.25
    assert rows["onnxruntime unmapped Identity"]["peer_ms"] == 0.125
    assert report["ours_ms"] == 3.0 and report["peer_ms"] == 3.375
    assert report["rows"][0]["step"] == "conv1 [conv2d]"  # the largest gap first


def test_a_whole_run_prints_rows_for_every_step(tmp_path: Path) -> None:
    model = tmp_path / "model.onnx"
    onnx.save(_graph(), str(model))
    build_library(model, ConfigBook(), tmp_path / "lib", threads=1, layout="nchwc")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "layer_gap.py"), str(model),
         "--library", str(tmp_path / "lib"), "--iterations", "3"],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    steps = [row for row in report["rows"] if row["kind"] != "onnxruntime only"]
    assert steps and all(row["ours_ms"] > 0 for row in steps)
    assert report["peer_ms"] > 0 and report["onnxruntime"]


def test_an_unreadable_model_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "layer_gap.py"), str(bad), "--library",
         str(tmp_path)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1 and "error: cannot read" in done.stderr
    assert "Traceback" not in done.stderr
    onnx.save(_graph(), str(bad))  # a model, but no library beside it
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "layer_gap.py"), str(bad), "--library",
         str(tmp_path), "--iterations", "2"], capture_output=True, text=True, timeout=300,
        check=False)
    assert done.returncode == 1 and "is not a kernel library" in done.stderr
    assert "Traceback" not in done.stderr


def test_openvino_nodes_map_back_by_their_names() -> None:
    """OpenVINO names a node after the ONNX node (with suffixes such as /WithoutBiases); its
    Reorder nodes are its layout transforms."""
    ours = [{"step": "conv1 [conv2d]", "kind": "kernel", "ms": 2.0, "nodes": ["conv1", "sig"]},
            {"step": "conv2 [conv2d]", "kind": "kernel", "ms": 1.0, "nodes": ["conv2"]}]
    peer = {"conv1/WithoutBiases": {"ms": 1.25, "op": "Convolution"},
            "sig": {"ms": 0.25, "op": "Eltwise"},
            "conv2": {"ms": 0.5, "op": "Convolution"},
            "x_abcd_aBcd16b_conv1": {"ms": 0.125, "op": "Reorder"}}
    report = layer_gap.compare(_graph(), ours, peer, "openvino")
    rows = {row["step"]: row for row in report["rows"]}
    assert rows["conv1 [conv2d]"]["peer_ms"] == 1.5 and rows["conv2 [conv2d]"]["gap_ms"] == 0.5
    assert rows["openvino layout reorders"]["peer_ms"] == 0.125
    assert rows["openvino layout reorders"]["kind"] == "openvino only"


def test_a_whole_run_against_openvino(tmp_path: Path) -> None:
    model = tmp_path / "model.onnx"
    onnx.save(_graph(), str(model))
    build_library(model, ConfigBook(), tmp_path / "lib", threads=1)
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "layer_gap.py"), str(model), "--peer", "openvino",
         "--library", str(tmp_path / "lib"), "--iterations", "3"],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["peer"] == "openvino" and report["openvino"]
    assert report["peer_ms"] > 0
    mapped = [row for row in report["rows"] if row["kind"] != "openvino only"]
    assert any(row["peer_ms"] > 0 for row in mapped)  # the convolutions found their steps
