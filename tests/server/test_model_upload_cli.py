"""``tuner submit`` of a model whose weights live beside it: packed into one archive, with
``--input-shape`` forwarded, over real HTTP."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from .test_http import live_server  # noqa: F401  (the fixture)

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


@pytest.fixture
def external_model(tmp_path: Path) -> Path:
    """x: (batch, 16) -> MatMul by a 16 x 8 weight stored in ``weights/mm.bin``."""
    w = np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], "mm")], "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        initializer=[numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    (tmp_path / "weights").mkdir()
    path = tmp_path / "mm.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="weights/mm.bin",
              size_threshold=0)
    return path


def test_submit_packs_external_data_and_pins_shapes(
        live_server: str, tokens: dict[str, str], external_model: Path,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    from tuner_service.cli.main import main

    flags = ["--server", live_server, "--token", tokens["user"], "--trials-per-task", "1",
             "--tuner", "random"]
    assert main(["submit", str(external_model), "--input-shape", "x=4x16", *flags]) == 0
    out = capsys.readouterr().out
    assert "1 tasks submitted" in out and "unsupported" not in out
    # unpinned, the dynamic batch leaves nothing to tune: the reason says what to pin
    assert main(["submit", str(external_model), *flags]) == 1
    captured = capsys.readouterr()
    assert "pin it with --input-shape x=DIMS" in captured.out
    assert "no tunable tasks" in captured.err


def test_submit_reports_a_missing_data_file(
        live_server: str, tokens: dict[str, str], external_model: Path,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    from tuner_service.cli.main import main

    (external_model.parent / "weights" / "mm.bin").unlink()
    assert main(["submit", str(external_model), "--server", live_server, "--token",
                 tokens["user"]]) == 2
    err = capsys.readouterr().err
    assert "'weights/mm.bin' is missing" in err and len(err.strip().splitlines()) == 1
