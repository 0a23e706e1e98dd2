"""``POST /api/v1/models`` with external data (one zip/tar archive) and pinned input shapes."""

from __future__ import annotations

import io
import re
import stat
import tarfile
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tuner_service.settings import Settings

from .fakes import bearer, conv_model

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

CONV_KEY = "conv2d:N=1,C=3,H=8,W=8,K=4,R=3,S=3,pad=1"
WEIGHT_BYTES = 4 * 3 * 3 * 3 * 4


@pytest.fixture(scope="module")
def members(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """A conv model saved with its weight in ``model.onnx.data``: the two files' bytes."""
    model = conv_model()
    folder = tmp_path_factory.mktemp("model")
    onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True,
              location="model.onnx.data", size_threshold=0)
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def make_zip(files: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, target)
    return buffer.getvalue()


def make_tar(files: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            archive.addfile(info)
    return buffer.getvalue()


def upload(client: TestClient, token: str, data: bytes, name: str = "model.zip",
           shapes: list[str] | None = None) -> tuple[int, dict[str, Any]]:
    answer = client.post("/api/v1/models", headers=bearer(token),
                         files={"file": (name, data, "application/octet-stream")},
                         data={"input_shape": shapes} if shapes else None)
    return answer.status_code, answer.json()


@pytest.mark.parametrize("make", [make_zip, make_tar])
def test_archive_upload_is_one_model_with_its_tasks(client: TestClient, tokens: dict[str, str],
                                                    members: dict[str, bytes],
                                                    make: Callable[..., bytes]) -> None:
    data = make(members)
    status, body = upload(client, tokens["user"], data)
    assert status == 201, body
    assert [t["workload"] for t in body["tasks"]] == [CONV_KEY]
    _, again = upload(client, tokens["user"], data)
    assert again["model_id"] == body["model_id"]  # the archive is the content address


def test_the_onnx_alone_is_refused_with_a_hint(client: TestClient, tokens: dict[str, str],
                                              members: dict[str, bytes]) -> None:
    status, body = upload(client, tokens["user"], members["model.onnx"], "model.onnx")
    assert status == 422
    assert "external file" in body["detail"] and "archive" in body["detail"]


def _short(members: dict[str, bytes]) -> dict[str, bytes]:
    return {**members, "model.onnx.data": members["model.onnx.data"][:WEIGHT_BYTES - 8]}


def _without_data(members: dict[str, bytes]) -> dict[str, bytes]:
    return {"model.onnx": members["model.onnx"]}


@pytest.mark.parametrize("make", [make_zip, make_tar])
@pytest.mark.parametrize(("build", "reason"), [
    (lambda m, make: make({**m, "../x": b"1"}), "leaves the model's folder"),
    (lambda m, make: make({**m, "/etc/x": b"1"}), "absolute path"),
    (lambda m, make: make(_without_data(m), {"model.onnx.data": "/etc/passwd"}),
     "symbolic link|is a link"),
    (lambda m, make: make(_without_data(m)), "'model.onnx.data' is missing from the archive"),
    (lambda m, make: make(_short(m)), f"has only {WEIGHT_BYTES - 8} bytes"),
    (lambda m, make: make({**m, "other.onnx": m["model.onnx"]}), "exactly one .onnx"),
])
def test_bad_archives_get_422(client: TestClient, tokens: dict[str, str],
                              members: dict[str, bytes], make: Callable[..., bytes],
                              build: Callable[..., bytes], reason: str) -> None:
    status, body = upload(client, tokens["user"], build(members, make))
    assert status == 422, body
    assert body["detail"].startswith("cannot read the model")
    assert re.search(reason, body["detail"]), body["detail"]


@pytest.mark.parametrize("make", [make_zip, make_tar])
def test_archive_limits_give_413(settings: Settings, tokens: dict[str, str],
                                 make_client: Callable[[Settings], TestClient],
                                 members: dict[str, bytes], make: Callable[..., bytes]) -> None:
    client = make_client(settings.with_overrides(max_model_bytes=64 * 1024,
                                                 max_archive_members=8))
    bomb = {**members, "padding.bin": b"\0" * (1 << 20)}  # 1 MiB of zeros: ~1 KiB packed
    status, body = upload(client, tokens["user"], make(bomb))
    assert status == 413 and "unpacks to more than the 65536-byte limit" in body["detail"]
    crowd = {**members, **{f"notes/{i}.txt": b"x" for i in range(10)}}
    status, body = upload(client, tokens["user"], make(crowd))
    assert status == 413 and "more than 8 members" in body["detail"]
    assert upload(client, tokens["user"], make(members))[0] == 201


def test_compressed_upload_limit_applies_while_streaming(
        settings: Settings, tokens: dict[str, str], members: dict[str, bytes],
        make_client: Callable[[Settings], TestClient]) -> None:
    client = make_client(settings.with_overrides(max_upload_bytes=512))
    data = make_zip(members)
    assert len(data) > 512

    def chunks() -> Any:  # no Content-Length: the body limit counts what arrives
        boundary = b"--b0undary"
        yield boundary + b'\r\nContent-Disposition: form-data; name="file"; filename="m.zip"'
        yield b"\r\nContent-Type: application/zip\r\n\r\n"
        for start in range(0, len(data), 256):
            yield data[start:start + 256]
        yield b"\r\n" + boundary + b"--\r\n"

    answer = client.post("/api/v1/models", content=chunks(),
                         headers={**bearer(tokens["user"]),
                                  "Content-Type": "multipart/form-data; boundary=b0undary"})
    assert answer.status_code == 413


# -- pinned input shapes --------------------------------------------------------------------

@pytest.fixture(scope="module")
def dynamic_model() -> bytes:
    """x: (batch, seq, 16) -> MatMul with a constant 16 x 8 weight -> y."""
    w = np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], "mm")], "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])],
        initializer=[numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return bytes(model.SerializeToString())


def test_pinned_shapes_make_dynamic_layers_tasks(client: TestClient, tokens: dict[str, str],
                                                 dynamic_model: bytes) -> None:
    status, plain = upload(client, tokens["user"], dynamic_model, "dyn.onnx")
    assert status == 201 and plain["tasks"] == []
    assert "--input-shape x=" in plain["unsupported"][0]["reason"]
    status, pinned = upload(client, tokens["user"], dynamic_model, "dyn.onnx", ["x=1x128x16"])
    assert status == 201, pinned
    assert [t["workload"] for t in pinned["tasks"]] == ["dense:M=128,N=8,K=16"]
    assert pinned["model_id"] != plain["model_id"] and pinned["sha256"] != plain["sha256"]
    _, other = upload(client, tokens["user"], dynamic_model, "dyn.onnx", ["x=2x128x16"])
    assert [t["workload"] for t in other["tasks"]] == ["dense:M=256,N=8,K=16"]
    _, same = upload(client, tokens["user"], dynamic_model, "dyn.onnx", ["x=1,128,16"])
    assert same["model_id"] == pinned["model_id"]  # the canonical form is the address


@pytest.mark.parametrize(("shapes", "reason"), [
    (["x=1x128"], "has 3 dimensions"),
    (["nope=1x2x16"], "not an input of the model"),
    (["x=1xx16"], "is not NAME=DIMS"),
    (["x=1x2x16", "x=1x3x16"], "two shapes"),
    (["x=1x2x15"], "fixed dimension 16"),
])
def test_bad_pinned_shapes_get_422(client: TestClient, tokens: dict[str, str],
                                   dynamic_model: bytes, shapes: list[str],
                                   reason: str) -> None:
    status, body = upload(client, tokens["user"], dynamic_model, "dyn.onnx", shapes)
    assert status == 422 and reason in body["detail"], body


def test_archive_with_pinned_shapes(client: TestClient, tokens: dict[str, str],
                                    members: dict[str, bytes]) -> None:
    status, body = upload(client, tokens["user"], make_zip(members), shapes=["x=1x3x8x8"])
    assert status == 201 and [t["workload"] for t in body["tasks"]] == [CONV_KEY]
