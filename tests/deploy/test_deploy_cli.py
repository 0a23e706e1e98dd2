"""``tuner build`` then ``tuner run`` from the command line; the run is a fresh process that
only has the build directory and the model file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from tests.deploy.conftest import make_model
from tuner_service.cli.main import main


def _model_file(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], name="fc", transB=1),
    ]
    weights = {"w": rng.standard_normal((16, 4, 3, 3)).astype(np.float32) * 0.2,
               "b": rng.standard_normal(16).astype(np.float32),
               "fc": rng.standard_normal((10, 16)).astype(np.float32),
               "fcb": rng.standard_normal(10).astype(np.float32)}
    model = make_model(nodes, {"x": (1, 4, 10, 10)}, {"y": (1, 10)}, weights)
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def test_build_then_run_in_a_fresh_process(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    model = _model_file(tmp_path)
    out = tmp_path / "lib"
    assert main(["build", str(model), "-o", str(out), "--threads", "2", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["layers"] >= 2 and summary["default"] == summary["kernels"]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "tuner_service.cli.main", "run", str(model), "--library",
         str(out), "--iterations", "3", "--check", "--json"],
        capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["threads"] == 2  # the build's thread count is the default
    assert report["iterations"] >= 3 and report["outputs"] == {"y": [1, 10]}
    latency = report["latency_ms"]
    assert 0 < latency["min"] <= latency["median"] <= latency["p90"]
    assert report["check"]["max_rel_error"] < 1e-4


def test_run_profile_says_where_the_time_goes(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    model = _model_file(tmp_path)
    out = tmp_path / "lib"
    assert main(["build", str(model), "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["run", str(model), "--library", str(out), "--iterations", "3", "--profile",
                 "--json"]) == 0
    profile = json.loads(capsys.readouterr().out)["profile"]
    kinds = profile["by_kind"]
    assert kinds["kernel"]["steps"] == 2  # the conv (bias + relu fused) and the gemm
    assert sum(k["ms"] for k in kinds.values()) == pytest.approx(profile["total_ms"])
    assert sum(k["share"] for k in kinds.values()) == pytest.approx(1.0)
    steps = profile["steps"]
    assert [s["ms"] for s in steps] == sorted((s["ms"] for s in steps), reverse=True)
    conv = next(s for s in steps if s["step"].startswith("conv ["))
    assert conv["kind"] == "kernel" and conv["gflops"] > 0  # tuned kernels know their work
    assert all(s["gflops"] is None for s in steps if s["kind"] != "kernel")
    assert main(["run", str(model), "--library", str(out), "--iterations", "3",
                 "--profile"]) == 0
    text = capsys.readouterr().out
    assert "slowest steps:" in text and "GFLOPS" in text


def test_run_reports_a_wrong_library_directory(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    model = _model_file(tmp_path)
    assert main(["run", str(model), "--library", str(tmp_path / "nowhere")]) == 1
    assert "manifest.json is missing" in capsys.readouterr().err


def test_build_reads_a_configs_file(tmp_path: Path) -> None:
    model = _model_file(tmp_path)
    configs = tmp_path / "configs.json"
    configs.write_text(json.dumps({"tasks": []}))
    assert main(["build", str(model), "--configs", str(configs), "-o", str(tmp_path / "o")]) == 0
    configs.write_text("not json at all")
    assert main(["build", str(model), "--configs", str(configs), "-o", str(tmp_path / "o")]) == 1
