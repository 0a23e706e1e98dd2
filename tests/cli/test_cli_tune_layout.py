"""``tuner tune --layout`` and ``tuner submit --layout``: the job tunes the workloads of the
library layout it names, and a blocked build then runs tuned blocked kernels."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.cli.conftest import run_tuner
from tuner_service.compiler.deploy.layout import host_block
from tuner_service.tuning.embedded import LocalService

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

pytestmark = pytest.mark.slow


def write_conv_model(path: Path) -> Path:
    """A 3x3 conv (bias + ReLU fused) then a depthwise 3x3 conv on an 8-channel 6x6 map."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
               for n, s in (("w1", (8, 4, 3, 3)), ("b1", (8,)), ("w2", (8, 1, 3, 3)))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], group=8, pads=[1, 1, 1, 1])]
    graph = helper.make_graph(
        nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_tune_auto_tunes_both_layouts_and_a_blocked_build_uses_them(tmp_path: Path) -> None:
    model = write_conv_model(tmp_path / "model.onnx")
    out = tmp_path / "tuned"
    done = run_tuner(["tune", str(model), "-o", str(out), "--trials", "2", "--threads", "1",
                      "--parallel-build", "1", "--json"], tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    ops = [t["workload"].split(":")[0] for t in report["tasks"]]
    assert ops == ["conv2d", "conv2d_nchwc", "depthwise_conv2d", "depthwise_conv2d_nchwc"]
    assert all(f"block={host_block()}" in t["workload"] for t in report["tasks"]
               if "_nchwc" in t["workload"])
    lib = tmp_path / "lib"
    built = run_tuner(["build", str(model), "--configs", str(out / "configs.json"), "-o",
                       str(lib), "--layout", "nchwc"], tmp_path)
    assert built.returncode == 0, built.stderr
    kernels = json.loads((lib / "manifest.json").read_text())["kernels"]
    assert [k["op"] for k in kernels] == ["conv2d_nchwc", "depthwise_conv2d_nchwc"]
    assert all(k["config_source"] == "tuned" for k in kernels), kernels


def test_submit_with_a_layout_uploads_the_blocked_tasks(tmp_path: Path,
                                                        server: LocalService) -> None:
    model = write_conv_model(tmp_path / "model.onnx")
    done = run_tuner(["submit", str(model), "--layout", "nchwc", "--block", "8",
                      "--server", server.url, "--token", server.token], tmp_path)
    assert done.returncode == 0, done.stderr
    job_id = int(done.stdout.split("job ")[1].split(":")[0])
    job = httpx.get(f"{server.url}/api/v1/jobs/{job_id}",
                    headers={"Authorization": f"Bearer {server.token}"}).json()
    assert sorted(t["workload"].split(":")[0] for t in job["tasks"]) == [
        "conv2d_nchwc", "depthwise_conv2d_nchwc"]
    assert all(t["workload"].endswith("block=8") or ",block=8," in t["workload"]
               for t in job["tasks"])
