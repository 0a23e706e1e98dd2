"""``tuner extract`` and ``tuner sample-model``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tuner_service.cli.main import main


@pytest.fixture(scope="module")
def bert_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("onnx")
    path = tmp_path_factory.mktemp("models") / "bert.onnx"
    assert main(["sample-model", "bert_block", "-o", str(path)]) == 0
    return path


def test_sample_model_writes_a_loadable_file(bert_path: Path, capsys: Any) -> None:
    onnx = pytest.importorskip("onnx")
    model = onnx.load(str(bert_path))
    assert model.graph.name == "bert_block"


def test_extract_table(bert_path: Path, capsys: Any) -> None:
    assert main(["extract", str(bert_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["workload", "key", "weight", "GFLOP"]
    row = next(line for line in out.splitlines()
               if "dense:M=128,N=768,K=768,epilogue=bias " in line)
    # query, key, value (bias) and the attention output (bias + residual): one space
    assert row.split()[-2:] == ["4", "0.151"]
    assert "5 tasks" in out


def test_extract_json(bert_path: Path, capsys: Any) -> None:
    assert main(["extract", str(bert_path), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload) == {"tasks", "unsupported"}
    first = payload["tasks"][0]
    assert first == {
        "workload": "dense:M=128,N=768,K=768,epilogue=bias",
        "weight": 4,  # with the attention output (bias + residual)
        "flops": 2 * 128 * 768 * 768,
        "description": "dense 128x768 by 768x768 (weights 768x768), fused bias",
    }
    assert payload["unsupported"] == []


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # TorchScript exporter notice
def test_extract_json_lists_unsupported(tmp_path: Path, capsys: Any) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    path = tmp_path / "conv3d.onnx"
    torch.onnx.export(
        torch.nn.Conv3d(4, 8, 3).eval(),
        (torch.randn(1, 4, 6, 6, 6),),
        str(path),
        dynamo=False,
    )
    assert main(["extract", str(path), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["tasks"] == []
    assert [u["op"] for u in payload["unsupported"]] == ["Conv"]
    assert set(payload["unsupported"][0]) == {"op", "node", "reason"}


@pytest.mark.parametrize("content", [b"", b"not a model at all", None])
def test_extract_bad_model_exits_2(tmp_path: Path, capsys: Any, content: bytes | None) -> None:
    pytest.importorskip("onnx")
    path = tmp_path / "bad.onnx"
    if content is not None:
        path.write_bytes(content)
    assert main(["extract", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1
    assert captured.err.startswith("error: ")


def test_unknown_sample_name_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        main(["sample-model", "vgg16", "-o", str(tmp_path / "x.onnx")])
    assert info.value.code == 2


def test_cli_module_imports_without_onnx() -> None:
    """``tuner --help`` must work on an install without the server extras."""
    code = (
        "import sys; sys.modules['onnx'] = None\n"
        "from tuner_service.cli.main import build_parser\n"
        "build_parser().parse_args(['sample-model', 'resnet18', '-o', 'x.onnx'])\n"
        "assert 'onnx' not in [m for m, v in sys.modules.items() if v is not None]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
