"""bench/paired.py runs engines in turn in one process and reports each run's ratio to the first
engine's run of the same round; whole on a small model, and its clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import paired

from tests.deploy.conftest import make_model
from tuner_service.compiler.deploy.configs import ConfigBook
from tuner_service.compiler.deploy.library import build_library

ROOT = Path(__file__).resolve().parents[2]


def _graph() -> onnx.ModelProto:
    rng = np.random.default_rng(2)
    weights = {"w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    return make_model(nodes, {"x": (1, 3, 24, 24)}, {"y": (1, 8, 24, 24)}, weights)


def test_rounds_run_every_engine_in_turn_starting_one_further_each_round() -> None:
    calls: list[str] = []
    fns = [lambda: calls.append("a"), lambda: calls.append("b"), lambda: calls.append("c")]
    times = paired.paired(fns, rounds=4, warmup=1)
    # one warm-up run each, then the rounds, each engine following each other as often
    warmup = ["a", "b", "c"]
    assert calls == [*warmup, "a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert [len(column) for column in times] == [4, 4, 4]


def test_ratios_pair_runs_of_the_same_round() -> None:
    # the machine halves its speed in the last two rounds: per-round ratios stay 0.5, while a
    # ratio of medians would not
    first = [1.0, 1.0, 1.0, 2.0, 2.0]
    second = [0.5, 0.5, 0.5, 1.0, 1.0]
    rows = paired.summary(["ours", "peer"], [first, second])
    assert rows[0]["ratio_to_first"] == 1.0 and rows[1]["ratio_to_first"] == 0.5
    assert rows[1]["median_ms"] == 0.5 and rows[1]["min_ms"] == 0.5


def test_a_whole_run_reports_each_engine(tmp_path: Path) -> None:
    model = tmp_path / "model.onnx"
    onnx.save(_graph(), str(model))
    build_library(model, ConfigBook(), tmp_path / "lib", threads=1)
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "paired.py"), str(model), str(tmp_path / "lib"),
         f"{tmp_path / 'lib'}@1", "onnxruntime", "--rounds", "3"],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    engines = [row["engine"] for row in report["engines"]]
    assert engines == [str(tmp_path / "lib"), f"{tmp_path / 'lib'}@1", "onnxruntime"]
    assert report["engines"][0]["ratio_to_first"] == 1.0
    assert all(row["min_ms"] > 0 and row["ratio_to_first"] > 0 for row in report["engines"])


def test_what_is_not_an_engine_is_a_clear_error(tmp_path: Path) -> None:
    model = tmp_path / "model.onnx"
    onnx.save(_graph(), str(model))
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "paired.py"), str(model), str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and "neither a peer" in done.stderr
    assert "Traceback" not in done.stderr
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "paired.py"), str(tmp_path / "missing.onnx"),
         "onnxruntime"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and "no model file" in done.stderr
