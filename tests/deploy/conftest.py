"""Fixtures for the deploy tests: build a library for a model, run it, compare with onnxruntime."""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402

from tuner_service.compiler.deploy.configs import ConfigBook  # noqa: E402

RunModel = Callable[..., tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]


def make_model(nodes: Sequence[Any], inputs: dict[str, Sequence[int]],
               outputs: dict[str, Sequence[int] | None],
               weights: dict[str, np.ndarray] | None = None, opset: int = 17) -> Any:
    """A one-graph fp32 model; initializers keep their numpy dtype."""
    graph = helper.make_graph(
        list(nodes), "tiny",
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, list(s))
         for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None if s is None else list(s))
         for n, s in outputs.items()],
        initializer=[numpy_helper.from_array(v, n) for n, v in (weights or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    # the checker wants a shape on every graph output: take the one inference gives
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.output}
    for output in model.graph.output:
        if output.name in inferred and not output.type.tensor_type.HasField("shape"):
            output.CopyFrom(inferred[output.name])
    return model


def onnxruntime_outputs(model: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def assert_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray],
                 rtol: float = 2e-4) -> None:
    assert set(got) == set(want)
    for name, expected in want.items():
        assert got[name].shape == expected.shape, name
        scale = max(1.0, float(np.max(np.abs(expected))))
        error = float(np.max(np.abs(got[name] - expected)))
        assert error <= rtol * scale, f"{name}: max abs error {error} (scale {scale})"


@pytest.fixture
def run_model(tmp_path: Path) -> RunModel:
    """Build a library for ``model`` (default configs unless a book is given), run it on seeded
    random inputs, return (our outputs, onnxruntime's outputs)."""
    from tuner_service.compiler.deploy.executor import ModelRunner
    from tuner_service.compiler.deploy.library import build_library
    from tuner_service.compiler.deploy.loader import KernelLibrary

    def run(model: Any, book: ConfigBook | None = None, threads: int = 1, seed: int = 0
            ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        out = tmp_path / f"lib{len(list(tmp_path.iterdir()))}"
        build_library(model, book or ConfigBook(), out)
        runner = ModelRunner(model, KernelLibrary(out), threads)
        feeds = runner.random_feeds(seed)
        return runner.run(feeds), onnxruntime_outputs(model, feeds)

    return run


@pytest.fixture
def example(tmp_path: Path) -> Path:
    """``examples/run_model.c`` built with the host's C compiler (skipped without one)."""
    compiler = shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler")
    binary = tmp_path / "run_model"
    root = Path(__file__).resolve().parents[2]
    subprocess.run([compiler, "-O2", "-o", str(binary), str(root / "examples/run_model.c"),
                    "-ldl"], check=True, capture_output=True)
    return binary
