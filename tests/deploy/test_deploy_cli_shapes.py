"""``tuner build`` / ``tuner run`` on a dynamo export: weights in a data file beside the model,
batch and sequence length pinned with ``--input-shape``, outputs checked against onnxruntime."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")

from tuner_service.cli.main import main  # noqa: E402


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(32, 96)
        self.out = torch.nn.Linear(32, 32)

    def forward(self, x: Any) -> Any:
        b, s, d = x.shape
        q, k, v = (t.view(b, s, 4, d // 4).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        scores = torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1)
        return self.out((scores @ v).transpose(1, 2).reshape(b, s, d))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("attention") / "attention.onnx"
    torch.manual_seed(0)
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Attention().eval(), (torch.randn(2, 16, 32),), str(path),
                          dynamo=True, input_names=["x"], dynamic_shapes={"x": dims},
                          verbose=False)
    assert (path.parent / "attention.onnx.data").is_file()
    return path


def test_build_and_run_with_pinned_shapes(model: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "lib"
    pin = ["--input-shape", "x=1x24x32"]
    assert main(["build", str(model), "-o", str(out), *pin, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["layers"] == 4  # qkv, q.k, scores.v, out: every MatMul is a kernel
    assert main(["run", str(model), "--library", str(out), *pin, "--iterations", "2",
                 "--check", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["outputs"] == {next(iter(report["outputs"])): [1, 24, 32]}
    assert report["kernel_layers"] == 4
    assert report["check"]["max_rel_error"] < 1e-4
    # the library remembers the pinned shapes: run needs no flag
    assert json.loads((out / "manifest.json").read_text())["model"]["input_shapes"] == {
        "x": [1, 24, 32]}
    assert main(["run", str(model), "--library", str(out), "--iterations", "1", "--json"]) == 0
    assert list(json.loads(capsys.readouterr().out)["outputs"].values()) == [[1, 24, 32]]


def test_build_without_pinned_shapes_names_the_input(model: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", str(model), "-o", str(tmp_path / "lib"), "--input-shape",
                 "x=1x24"]) == 2
    assert "has 3 dimensions" in capsys.readouterr().err
