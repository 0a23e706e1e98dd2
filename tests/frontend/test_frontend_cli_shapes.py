"""``tuner extract`` on torch exports: external data beside the model, ``--input-shape``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("onnx")
torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")

from shape_models import Attention, ShuffleBlocks, export  # noqa: E402

from tuner_service.cli.main import main  # noqa: E402


@pytest.fixture(scope="module")
def attention(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Dynamo export with dynamic batch and sequence: weights in ``attention.onnx.data``."""
    path = tmp_path_factory.mktemp("attention") / "attention.onnx"
    export(Attention(), torch.randn(2, 16, 32), path, dynamo=True, dynamic={0: "b", 1: "s"})
    assert (path.parent / "attention.onnx.data").is_file()
    return path


def test_extract_reads_the_dynamo_export_with_its_data_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = export(ShuffleBlocks(), torch.randn(1, 3, 32, 32), tmp_path / "shuffle.onnx", True)
    assert (tmp_path / "shuffle.onnx.data").is_file()
    assert main(["extract", str(path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["unsupported"] == []
    assert sum(task["weight"] for task in result["tasks"]) == 11
    (tmp_path / "shuffle.onnx.data").unlink()
    assert main(["extract", str(path)]) == 2
    assert "'shuffle.onnx.data' is missing" in capsys.readouterr().err


def test_extract_pins_dynamic_inputs(attention: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["extract", str(attention), "--json"]) == 0
    dynamic = json.loads(capsys.readouterr().out)
    assert dynamic["tasks"] == [] and len(dynamic["unsupported"]) == 6
    assert main(["extract", str(attention), "--input-shape", "x=1x64x32", "--json"]) == 0
    pinned = json.loads(capsys.readouterr().out)
    assert pinned["unsupported"] == []
    assert [t["workload"] for t in pinned["tasks"]] == [
        "dense:M=64,N=32,K=32,epilogue=bias", "batch_matmul:B=4,M=64,N=64,K=8",
        "batch_matmul:B=4,M=64,N=8,K=64"]


@pytest.mark.parametrize(("flag", "message"), [
    ("x=1x64", "has 3 dimensions"),
    ("y=1x64x32", "not an input of the model"),
    ("x=1x64x33", "fixed dimension 32 at axis 2"),
    ("x:1x64x32", "is not NAME=DIMS"),
])
def test_extract_explains_bad_pinned_shapes(attention: Path, flag: str, message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["extract", str(attention), "--input-shape", flag]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
