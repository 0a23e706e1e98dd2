"""``tuner run --inputs FILE.npz --outputs OUT.npz``: real data in and out, and a one-line error
(exit status 2, no traceback) for inputs that do not fit the model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.deploy.conftest import make_model, onnxruntime_outputs
from tuner_service.cli.main import main


def embedding_model() -> Any:
    """Token ids (int64) pick rows of a table, added to a float input, then a Gemm (a kernel)."""
    rng = np.random.default_rng(4)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"], name="embed", axis=0),
        helper.make_node("Add", ["e", "x"], ["s"], name="add"),
        helper.make_node("Gemm", ["s", "w"], ["y"], name="fc", transB=1),
    ]
    weights = {"table": rng.standard_normal((50, 16)).astype(np.float32),
               "w": rng.standard_normal((8, 16)).astype(np.float32)}
    graph = helper.make_graph(
        nodes, "embed",
        [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [5]),
         helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [5, 16])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [5, 8])],
        initializer=[onnx.numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture
def built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # tuner run sets it; restore it afterwards
    model = tmp_path / "model.onnx"
    model.write_bytes(embedding_model().SerializeToString())
    assert main(["build", str(model), "-o", str(tmp_path / "lib")]) == 0
    return model, tmp_path / "lib"


def good_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(9)
    return {"ids": rng.integers(0, 50, 5).astype(np.int64),
            "x": rng.standard_normal((5, 16)).astype(np.float32)}


def run(built: tuple[Path, Path], *extra: str) -> int:
    model, library = built
    return main(["run", str(model), "--library", str(library), "--iterations", "1", *extra])


def test_inputs_and_outputs_round_trip(built: tuple[Path, Path], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    feeds = good_inputs()
    np.savez(tmp_path / "in.npz", **feeds)
    out = tmp_path / "out.npz"
    assert run(built, "--inputs", str(tmp_path / "in.npz"), "--outputs", str(out),
               "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["inputs"] == str(tmp_path / "in.npz")
    assert report["outputs_file"] == str(out)
    with np.load(out) as saved:
        got = {name: saved[name] for name in saved.files}
    want = onnxruntime_outputs(embedding_model(), feeds)
    assert set(got) == {"y"} and got["y"].dtype == np.float32
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5)


def _bad(feeds: dict[str, Any]) -> dict[str, Any]:
    return {**good_inputs(), **feeds}


@pytest.mark.parametrize(("feeds", "message"), [
    ({**good_inputs(), "extra": np.zeros(3, np.float32)},
     "no input named 'extra'; its inputs are 'ids' int64[5], 'x' float32[5x16]"),
    ({"x": good_inputs()["x"]}, "missing model input 'ids'"),
    (_bad({"x": np.zeros((5, 16))}), "'x' has dtype float64, the model expects float32"),
    (_bad({"ids": np.zeros(5, np.int32)}), "'ids' has dtype int32, the model expects int64"),
    (_bad({"x": np.zeros((4, 16), np.float32)}), "'x' has shape 4x16, the model expects "
     "float32[5x16]"),
], ids=["unknown", "missing", "float64", "int32", "shape"])
def test_inputs_that_do_not_fit_are_one_line_errors(
        built: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        feeds: dict[str, np.ndarray], message: str) -> None:
    np.savez(tmp_path / "in.npz", **feeds)
    assert run(built, "--inputs", str(tmp_path / "in.npz")) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def _write_unreadable(path: Path, kind: str) -> None:
    if kind == "text":
        path.write_text("not numpy at all")
    elif kind == "npy":
        with path.open("wb") as handle:  # np.save(path) would append .npy to the name
            np.save(handle, np.zeros(3, np.float32))
    elif kind == "pickle":
        np.savez(path, x=np.array([{"a": 1}], dtype=object))


@pytest.mark.parametrize(("kind", "message"), [
    ("missing", "does not exist"), ("text", "cannot read"),
    ("npy", "holds a single array"), ("pickle", "cannot read"),
])
def test_unreadable_inputs_files_are_one_line_errors(
        built: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        kind: str, message: str) -> None:
    path = tmp_path / "in.npz"
    _write_unreadable(path, kind)
    assert run(built, "--inputs", str(path)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_unwritable_outputs_path_is_an_error(built: tuple[Path, Path], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert run(built, "--outputs", str(tmp_path / "no" / "such" / "dir" / "out.npz")) == 2
    assert "cannot write outputs" in capsys.readouterr().err


def test_a_dynamic_input_needs_real_data(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                       {"x": ("batch", 4)}, {"y": ("batch", 4)})
    path = tmp_path / "dynamic.onnx"
    path.write_bytes(model.SerializeToString())
    assert main(["build", str(path), "-o", str(tmp_path / "lib")]) == 0
    args = ["run", str(path), "--library", str(tmp_path / "lib"), "--iterations", "1"]
    assert main(args) == 2
    assert "dynamic shapes; pass arrays explicitly" in capsys.readouterr().err
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    np.savez(tmp_path / "in.npz", x=x)
    assert main([*args, "--inputs", str(tmp_path / "in.npz"), "--outputs",
                 str(tmp_path / "out.npz")]) == 0
    with np.load(tmp_path / "out.npz") as saved:
        np.testing.assert_array_equal(saved["y"], np.maximum(x, 0))
