"""Model archives (zip/tar of one .onnx and its data files): reading, limits, packing."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper  # noqa: E402

from tuner_service.compiler.frontend.archive import (  # noqa: E402
    ArchiveLimits,
    is_archive,
    model_upload,
    pack_model,
    read_archive,
)
from tuner_service.compiler.frontend.errors import ModelError, ModelTooLarge  # noqa: E402
from tuner_service.compiler.frontend.extract import extract_tasks  # noqa: E402

LIMITS = ArchiveLimits(max_bytes=1 << 20, max_members=16)
CONV_KEY = "conv2d:N=1,C=3,H=8,W=8,K=4,R=3,S=3,pad=1"


@pytest.fixture
def saved(tiny_model: Any, tmp_path: Path) -> Path:
    """A conv model saved with its weight in ``model.onnx.data`` beside it."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], "conv", pads=[1, 1, 1, 1])]
    w = np.random.default_rng(0).normal(size=(4, 3, 3, 3)).astype(np.float32)
    model = tiny_model(nodes, {"x": (1, 3, 8, 8)}, {"y": (1, 4, 8, 8)}, {"w": w})
    path = tmp_path / "m" / "model.onnx"
    path.parent.mkdir()
    onnx.save(model, str(path), save_as_external_data=True, location="model.onnx.data",
              size_threshold=0)
    return path


def _members(saved: Path, prefix: str = "") -> dict[str, bytes]:
    return {prefix + p.name: p.read_bytes() for p in sorted(saved.parent.iterdir())}


def make_zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def make_tar(members: dict[str, bytes], mode: str = "w:gz") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.mark.parametrize("make", [make_zip, make_tar,
                                  lambda m: make_tar(m, "w"), lambda m: make_tar(m, "w:xz")])
@pytest.mark.parametrize("prefix", ["", "bert/", "./"])
def test_good_archives_give_the_model_and_its_weights(saved: Path, make: Any,
                                                      prefix: str) -> None:
    data = make(_members(saved, prefix))
    assert is_archive(data)
    archive = read_archive(data, LIMITS)
    assert archive.name.endswith("model.onnx")
    result = extract_tasks(archive.model, files=archive.files)
    assert [t.workload.key for t in result.tasks] == [CONV_KEY]


def test_an_onnx_file_is_not_an_archive(saved: Path) -> None:
    assert not is_archive(saved.read_bytes())


def test_decompression_stops_at_the_limit() -> None:
    # 64 MiB of zeros compress to ~64 KiB: the limit, not the header, decides
    bomb = {"model.onnx": b"\0" * (64 << 20)}
    for data in (make_zip(bomb), make_tar(bomb)):
        assert len(data) < 1 << 20
        with pytest.raises(ModelTooLarge, match="unpacks to more than"):
            read_archive(data, LIMITS)


def test_member_count_is_limited(saved: Path) -> None:
    members = {**_members(saved), **{f"junk/{i}.txt": b"x" for i in range(20)}}
    for data in (make_zip(members), make_tar(members)):
        with pytest.raises(ModelTooLarge, match="more than 16 members"):
            read_archive(data, LIMITS)


@pytest.mark.parametrize(("members", "reason"), [
    ({"a.onnx": b"1", "b.onnx": b"2"}, "exactly one .onnx file, it holds a.onnx, b.onnx"),
    ({"weights.bin": b"1"}, "exactly one .onnx file, it holds none"),
    ({"../model.onnx": b"1"}, "leaves the model's folder"),
    ({"/tmp/model.onnx": b"1"}, "absolute path"),
])
def test_bad_member_sets_are_refused(members: dict[str, bytes], reason: str) -> None:
    for data in (make_zip(members), make_tar(members)):
        with pytest.raises(ModelError, match=reason):
            read_archive(data, LIMITS)


def test_macos_metadata_is_ignored(saved: Path) -> None:
    members = {**_members(saved), "__MACOSX/._model.onnx": b"junk", "._model.onnx": b"junk"}
    assert read_archive(make_zip(members), LIMITS).name == "model.onnx"


def test_tar_links_are_refused(saved: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(saved, "model.onnx")
        link = tarfile.TarInfo("model.onnx.data")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive.addfile(link)
    with pytest.raises(ModelError, match="is a link"):
        read_archive(buffer.getvalue(), LIMITS)


def test_corrupt_archive_is_a_model_error(saved: Path) -> None:
    data = make_zip(_members(saved))
    with pytest.raises(ModelError, match="cannot read the archive"):
        read_archive(data[: len(data) // 2], LIMITS)


def test_pack_model_round_trips(saved: Path) -> None:
    packed = pack_model(saved)
    assert packed is not None and is_archive(packed)
    archive = read_archive(packed, LIMITS)
    assert [t.workload.key for t in extract_tasks(archive.model, files=archive.files).tasks] \
        == [CONV_KEY]


def test_pack_model_leaves_self_contained_models_alone(saved: Path, tmp_path: Path) -> None:
    path = tmp_path / "whole.onnx"
    onnx.save(onnx.load(str(saved)), str(path))  # loads the data, saves it inline
    assert pack_model(path) is None


@pytest.mark.parametrize(("make", "suffix"), [(make_zip, "zip"), (make_tar, "tar.gz")])
def test_an_archive_on_disk_loads_like_an_upload(saved: Path, tmp_path: Path, make: Any,
                                                 suffix: str) -> None:
    path = tmp_path / f"model.{suffix}"
    path.write_bytes(make(_members(saved, "model/")))
    assert [t.workload.key for t in extract_tasks(path).tasks] == [CONV_KEY]
    assert pack_model(path) is None  # submitted as it is
    assert model_upload(path) == (path.read_bytes(), path.name)
