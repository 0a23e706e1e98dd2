"""``POST /api/v1/models`` with ``layout``/``block``: the tasks of a blocked library (its conv
layers as ``conv2d_nchwc`` workloads), a model of its own beside the plain upload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from . import fakes
from .fakes import bearer

onnx = pytest.importorskip("onnx")

CONV_KEY = "conv2d:N=1,C=3,H=8,W=8,K=4,R=3,S=3,pad=1"
BLOCKED_KEY = "conv2d_nchwc:N=1,C=3,H=8,W=8,K=4,R=3,S=3,pad=1,block=8"


@pytest.fixture(scope="module")
def conv_model() -> bytes:
    return bytes(fakes.conv_model().SerializeToString())


def upload(client: TestClient, token: str, data: bytes,
           form: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    answer = client.post("/api/v1/models", headers=bearer(token),
                         files={"file": ("conv.onnx", data, "application/octet-stream")},
                         data=form)
    return answer.status_code, answer.json()


def test_each_layout_is_a_model_with_its_own_tasks(client: TestClient, tokens: dict[str, str],
                                                   conv_model: bytes) -> None:
    status, plain = upload(client, tokens["user"], conv_model)
    assert status == 201 and [t["workload"] for t in plain["tasks"]] == [CONV_KEY]
    status, blocked = upload(client, tokens["user"], conv_model,
                             {"layout": "nchwc", "block": "8"})
    assert status == 201, blocked
    assert [t["workload"] for t in blocked["tasks"]] == [BLOCKED_KEY]
    status, both = upload(client, tokens["user"], conv_model, {"layout": "auto", "block": "8"})
    assert [t["workload"] for t in both["tasks"]] == [CONV_KEY, BLOCKED_KEY]
    assert len({plain["model_id"], blocked["model_id"], both["model_id"]}) == 3
    status, sixteen = upload(client, tokens["user"], conv_model,
                             {"layout": "nchwc", "block": "16"})
    assert sixteen["tasks"][0]["workload"].endswith("block=16")
    assert sixteen["model_id"] != blocked["model_id"]
    _, again = upload(client, tokens["user"], conv_model, {"layout": "nchwc", "block": "8"})
    assert again["model_id"] == blocked["model_id"]  # the layout is part of the address


@pytest.mark.parametrize(("form", "reason"), [
    ({"layout": "nhwc"}, "unknown layout"),
    ({"layout": "nchwc"}, "needs the channel block"),
    ({"layout": "auto", "block": "12"}, "not 12"),
])
def test_a_bad_layout_gets_a_clear_refusal(client: TestClient, tokens: dict[str, str],
                                           conv_model: bytes, form: dict[str, str],
                                           reason: str) -> None:
    status, body = upload(client, tokens["user"], conv_model, form)
    assert status in (400, 422), body
    assert reason in str(body["detail"])


def test_the_int8_arithmetic_addresses_quantized_models_only(
        client: TestClient, tokens: dict[str, str], conv_model: bytes, tmp_path: Path) -> None:
    """sat16 names other tasks of a quantized model (``tuner submit`` sends its CPU's
    arithmetic), so such an upload is a model of its own; a model without int8 layers is the
    same model whatever the field says."""
    pytest.importorskip("onnxruntime.quantization")
    from tests.frontend.quantized_models import quantized

    _, plain = upload(client, tokens["user"], conv_model, {"int8": "exact"})
    _, same = upload(client, tokens["user"], conv_model, {"int8": "sat16"})
    assert same["model_id"] == plain["model_id"]
    model = quantized(tmp_path, "qdq", reduce_range=False).read_bytes()
    status, exact = upload(client, tokens["user"], model, {"int8": "exact"})
    assert status == 201, exact
    _, saturating = upload(client, tokens["user"], model, {"int8": "sat16"})
    assert saturating["model_id"] != exact["model_id"]
    keys = [t["workload"] for t in saturating["tasks"] if "_int8" in t["workload"]]
    assert keys and all("weights=sat16" in k for k in keys if "C=3," not in k), keys
    assert not [t for t in exact["tasks"] if "sat16" in t["workload"]]
    _, again = upload(client, tokens["user"], model, {"int8": "sat16"})
    assert again["model_id"] == saturating["model_id"]
    status, body = upload(client, tokens["user"], model, {"int8": "fast"})
    assert status in (400, 422) and "unknown int8 arithmetic" in str(body["detail"])
