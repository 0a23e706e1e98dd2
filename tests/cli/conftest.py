"""Fixtures for the CLI tests: a small real ONNX model and the ``tuner`` command as users run
it (a child process, so exit codes, stderr and tracebacks are what a shell would see)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from tuner_service.tuning.embedded import LocalService

TUNER = [sys.executable, "-m", "tuner_service.cli.main"]


def write_small_model(path: Path) -> Path:
    """Two dense layers (one with a fused bias + ReLU) on a [4, 64] input."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("w1", (32, 64)), ("b1", (32,)), ("w2", (32, 16)))]
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1, name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")]
    graph = helper.make_graph(
        nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture
def small_model(tmp_path: Path) -> Path:
    return write_small_model(tmp_path / "model.onnx")


def run_tuner(args: Sequence[str], cwd: Path, timeout: float = 600,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # HOME in the scratch dir: nothing of a test lands in the real ~/.tuner
    environment = {**os.environ, "HOME": str(cwd), "TUNER_DATA_DIR": str(cwd / ".tuner"),
                   **(env or {})}
    environment.pop("TUNER_DATABASE_URL", None)
    return subprocess.run([*TUNER, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=environment)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalService]:
    """An embedded server (SQLite, no workers) on a free port, for the client commands."""
    from tuner_service.settings import Settings
    from tuner_service.tuning.embedded import local_service

    data = tmp_path / "server"
    settings = Settings(data_dir=data, database_url=f"sqlite:///{data / 'tuner.db'}", port=0)
    with local_service(settings, workers=None) as service:
        yield service
