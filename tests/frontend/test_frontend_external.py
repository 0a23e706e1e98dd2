"""External data read from a model's folder: the good case, and every way out of the folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper  # noqa: E402

from tuner_service.compiler.frontend.errors import ModelError  # noqa: E402
from tuner_service.compiler.frontend.external import check_location  # noqa: E402
from tuner_service.compiler.frontend.extract import extract_tasks  # noqa: E402
from tuner_service.compiler.frontend.loading import load_model  # noqa: E402

CONV_KEY = "conv2d:N=1,C=3,H=8,W=8,K=4,R=3,S=3,pad=1"


@pytest.fixture
def conv_model(tiny_model: Any) -> Any:
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], "conv", pads=[1, 1, 1, 1])]
    w = np.random.default_rng(0).normal(size=(4, 3, 3, 3)).astype(np.float32)
    return tiny_model(nodes, {"x": (1, 3, 8, 8)}, {"y": (1, 4, 8, 8)}, {"w": w})


def save_external(model: Any, folder: Path, location: str = "model.onnx.data") -> Path:
    """``model`` saved with every tensor in ``location`` (relative to the model's folder)."""
    (folder / location).parent.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=location, size_threshold=0)
    return path


def _relocate(path: Path, location: str) -> None:
    """Point every external tensor of the saved model at ``location``."""
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    path.write_bytes(model.SerializeToString())


def test_external_data_beside_the_model_is_read(conv_model: Any, tmp_path: Path) -> None:
    expected = onnx.numpy_helper.to_array(conv_model.graph.initializer[0])
    path = save_external(conv_model, tmp_path / "m")  # (moves conv_model's data out too)
    assert (tmp_path / "m" / "model.onnx.data").stat().st_size == 4 * 3 * 3 * 3 * 4
    result = extract_tasks(path)
    assert [t.workload.key for t in result.tasks] == [CONV_KEY]
    loaded = load_model(path)
    weight = onnx.numpy_helper.to_array(loaded.graph.initializer[0])
    np.testing.assert_array_equal(weight, expected)  # the bytes, not just the shape


def test_external_data_in_a_subfolder_is_read(conv_model: Any, tmp_path: Path) -> None:
    path = save_external(conv_model, tmp_path / "m", "weights/w.bin")
    assert [t.workload.key for t in extract_tasks(path).tasks] == [CONV_KEY]


def test_bytes_of_such_a_model_are_refused(conv_model: Any, tmp_path: Path) -> None:
    path = save_external(conv_model, tmp_path / "m")
    with pytest.raises(ModelError, match="external file"):
        extract_tasks(path.read_bytes())


@pytest.mark.parametrize(("location", "reason"), [
    ("/etc/hostname", "absolute path"),
    ("../secret.bin", "leaves the model's folder"),
    ("weights/../../secret.bin", "leaves the model's folder"),
    ("C:/secret.bin", "absolute path"),
    ("weights\\w.bin", "absolute path"),
])
def test_locations_outside_the_folder_are_refused(conv_model: Any, tmp_path: Path,
                                                  location: str, reason: str) -> None:
    (tmp_path / "secret.bin").write_bytes(b"\0" * 4096)
    path = save_external(conv_model, tmp_path / "m")
    _relocate(path, location)
    with pytest.raises(ModelError, match=reason):
        extract_tasks(path)


def test_symlink_out_of_the_folder_is_refused(conv_model: Any, tmp_path: Path) -> None:
    path = save_external(conv_model, tmp_path / "m")
    data = path.parent / "model.onnx.data"
    outside = tmp_path / "outside.data"
    data.rename(outside)
    os.symlink(outside, data)
    with pytest.raises(ModelError, match="link that leads out"):
        extract_tasks(path)


def test_symlink_inside_the_folder_is_followed(conv_model: Any, tmp_path: Path) -> None:
    path = save_external(conv_model, tmp_path / "m")
    data = path.parent / "model.onnx.data"
    data.rename(path.parent / "real.data")
    os.symlink("real.data", data)
    assert [t.workload.key for t in extract_tasks(path).tasks] == [CONV_KEY]


def test_missing_data_file_is_named(conv_model: Any, tmp_path: Path) -> None:
    path = save_external(conv_model, tmp_path / "m")
    (path.parent / "model.onnx.data").unlink()
    with pytest.raises(ModelError, match=r"'model\.onnx\.data' is missing"):
        extract_tasks(path)


def test_data_file_shorter_than_the_tensor_is_refused(conv_model: Any, tmp_path: Path) -> None:
    path = save_external(conv_model, tmp_path / "m")
    data = path.parent / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:-4])
    with pytest.raises(ModelError, match="has only 428 bytes"):
        extract_tasks(path)


def test_length_that_disagrees_with_the_dims_is_refused(conv_model: Any, tmp_path: Path) -> None:
    path = save_external(conv_model, tmp_path / "m")
    model = onnx.load(str(path), load_external_data=False)
    entry = model.graph.initializer[0].external_data.add()
    entry.key, entry.value = "length", "16"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ModelError, match="432 bytes of data but its external length is 16"):
        extract_tasks(path)


def test_offset_past_the_end_is_refused(conv_model: Any, tmp_path: Path) -> None:
    path = save_external(conv_model, tmp_path / "m")
    model = onnx.load(str(path), load_external_data=False)
    entry = model.graph.initializer[0].external_data.add()
    entry.key, entry.value = "offset", "4096"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ModelError, match="reads bytes 4096"):
        extract_tasks(path)


@pytest.mark.parametrize("location", ["", "a\x00b", "/", ".", "a/../../b"])
def test_check_location_refuses_nonsense(location: str) -> None:
    with pytest.raises(ModelError):
        check_location(location)


def test_check_location_normalises() -> None:
    assert check_location("./weights//w.bin") == "weights/w.bin"
