"""Bad input against a live server: oversized bodies (declared or streamed), truncated,
malformed and hostile ONNX files, bad records, invalid workload keys, configs and results.
Each gets a clear 4xx, and the database row counts show nothing was stored half-way."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from rel_live import LiveServer, create_tokens, wait_until

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

LIMIT = 300_000
TABLES = ("models", "tasks", "jobs", "job_tasks", "measurements", "tuning_log")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, dict[str, str]]]:
    from tuner_service.db.migrate import upgrade

    workdir = tmp_path_factory.mktemp("badinput")
    url = f"sqlite:///{workdir / 'tuner.db'}"
    upgrade(url)
    tokens = create_tokens(url)
    server = LiveServer(url, workdir, max_upload_bytes=LIMIT, queue_depth=4, batch_size=4)
    server.start()
    try:
        yield server, tokens
    finally:
        server.stop()


def counts(server: LiveServer) -> dict[str, int]:
    from sqlalchemy import create_engine, text

    engine = create_engine(server.database_url)
    try:
        with engine.connect() as conn:
            return {t: int(conn.execute(text(f"SELECT COUNT(*) FROM {t}")).scalar_one())
                    for t in TABLES}
    finally:
        engine.dispose()


def refused(server: LiveServer, response: httpx.Response, status: int, words: str) -> None:
    assert response.status_code == status, response.text[:500]
    detail = json.dumps(response.json()["detail"])
    assert words.lower() in detail.lower(), detail


# ---- hostile and broken ONNX files ------------------------------------------------------------

def _model(nodes: list[Any], inputs: dict[str, list[Any]], outputs: dict[str, list[Any]],
           inits: tuple[Any, ...] = ()) -> bytes:
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
        initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return bytes(model.SerializeToString())


def _matmul(x: list[int], w: list[int], inits: tuple[Any, ...] = ()) -> bytes:
    inputs = {"x": x} if inits else {"x": x, "w": w}
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], inputs, {"y": ["a", "b"]},
                  inits)


def _conv_model() -> bytes:
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    return _model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                  {"x": [1, 3, 8, 8]}, {"y": [1, 4, 8, 8]}, (w,))


def _external(location: str) -> bytes:
    model = onnx.load_from_string(_conv_model())
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location
    return bytes(model.SerializeToString())


def _lying_initializer() -> bytes:
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1 << 31, 1 << 31])
    return _matmul([2, 1 << 31], [], (tensor,))


def _short_raw_data() -> bytes:
    tensor = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    tensor.dims[:] = [4096, 4096]
    return _matmul([2, 4096], [], (tensor,))


def _huge_constant_of_shape() -> bytes:
    shape = numpy_helper.from_array(np.array([1 << 40, 1 << 40], np.int64), "s")
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["c"]),
             helper.make_node("MatMul", ["c", "c"], ["y"])]
    return _model(nodes, {}, {"y": ["a", "b"]}, (shape,))


def _varint(value: int) -> bytes:
    out = b""
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            return out + bytes([low])
        out += bytes([low | 0x80])


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _deeply_nested(depth: int = 300) -> bytes:
    """If inside If ... ``depth`` times, written as raw protobuf (onnx refuses to build it)."""
    graph = _field(1, _field(4, b"Identity") + _field(1, b"x") + _field(2, b"z"))
    for _ in range(depth):
        attribute = _field(1, b"then_branch") + _field(6, graph) + _varint(20 << 3) + _varint(5)
        graph = _field(1, _field(4, b"If") + _field(1, b"cond") + _field(2, b"z")
                       + _field(5, attribute))
    return _varint(1 << 3) + _varint(8) + _field(7, graph) + _field(8, _varint(2 << 3) + b"\x11")


def _half_of_a_model() -> bytes:
    w = numpy_helper.from_array(np.ones((64, 64, 3, 3), np.float32), "w")
    data = _model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                  {"x": [1, 64, 16, 16]}, {"y": [1, 64, 16, 16]}, (w,))
    return data[: len(data) // 2]


HOSTILE: dict[str, tuple[Any, str]] = {
    "empty": (lambda: b"", "empty"),
    "random bytes": (lambda: np.random.default_rng(1).bytes(4096), "not an ONNX model"),
    "json": (lambda: b'{"graph": {"node": []}}', "not an ONNX model"),
    "truncated in the middle": (_half_of_a_model, "truncated"),
    "truncated by one byte": (lambda: _conv_model()[:-1], "onnx"),
    "a graph, not a model": (
        lambda: bytes(onnx.load_from_string(_conv_model()).graph.SerializeToString()), "onnx"),
    "external data /etc/passwd": (lambda: _external("/etc/passwd"), "external file"),
    "external data ../../": (lambda: _external("../../secret.bin"), "external file"),
    "huge dimensions": (lambda: _matmul([1 << 20, 1 << 20], [1 << 20, 1 << 20]),
                        "impossible dimensions"),
    "int64 dimensions": (lambda: _matmul([1, 1 << 62], [1 << 62, 4]), "impossible dimensions"),
    "negative dimension": (lambda: _matmul([-3, 4], [4, 4]), "negative"),
    "initializer without data": (_lying_initializer, "invalid onnx model"),
    "initializer data too short": (_short_raw_data, "too small"),
    "ConstantOfShape 2^40": (_huge_constant_of_shape, "impossible dimensions"),
    "window larger than input": (
        lambda: _model([helper.make_node("Conv", ["x", "w"], ["y"])], {"x": [1, 3, 4, 4]},
                       {"y": ["a", "b", "c", "d"]},
                       (numpy_helper.from_array(np.ones((4, 3, 9, 9), np.float32), "w"),)),
        "impossible dimensions"),
    "If nested 300 deep": (_deeply_nested, "not an ONNX model"),
    "unknown operator": (lambda: _model([helper.make_node("NoSuchOp", ["x"], ["y"])],
                                        {"x": [2, 2]}, {"y": [2, 2]}), "invalid onnx model"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_bad_models_get_a_clear_422_and_store_nothing(
        live: tuple[LiveServer, dict[str, str]], case: str) -> None:
    server, tokens = live
    build, words = HOSTILE[case]
    before = counts(server)
    answer = server.request("POST", "/models", tokens["user"],
                            files={"file": ("m.onnx", build(), "application/octet-stream")})
    refused(server, answer, 422, words)
    assert counts(server) == before


def test_a_good_model_is_still_accepted(live: tuple[LiveServer, dict[str, str]]) -> None:
    """The control: the same route stores a sound model (so the refusals above mean something)."""
    server, tokens = live
    before = counts(server)
    answer = server.call("POST", "/models", tokens["user"],
                         files={"file": ("m.onnx", _conv_model(), "application/octet-stream")})
    assert answer["tasks"] and counts(server)["models"] == before["models"] + 1


# ---- size limits ------------------------------------------------------------------------------

def test_an_upload_over_the_limit_gets_413(live: tuple[LiveServer, dict[str, str]]) -> None:
    server, tokens = live
    before = counts(server)
    answer = server.request("POST", "/models", tokens["user"],
                            files={"file": ("m.onnx", b"\0" * (LIMIT + 1), "x/y")})
    refused(server, answer, 413, "limit")
    answer = server.request("POST", "/records", tokens["user"], content=b"\n" * (LIMIT + 1))
    refused(server, answer, 413, "limit")
    assert counts(server) == before


def test_a_streamed_body_without_length_is_cut_off_at_the_limit(
        live: tuple[LiveServer, dict[str, str]]) -> None:
    """Chunked transfer: no Content-Length to check up front, so the count while streaming
    must stop it. The body here never ends on its own; the server must answer anyway."""
    import select
    import socket

    server, tokens = live
    head = (f"POST /api/v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {tokens['user']}\r\n"
            "Content-Type: multipart/form-data; boundary=b\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()
    part = b'--b\r\nContent-Disposition: form-data; name="file"; filename="m.onnx"\r\n\r\n'
    chunk = b"4000\r\n" + b"\0" * 0x4000 + b"\r\n"
    sent, answer = 0, b""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head + b"%x\r\n" % len(part) + part + b"\r\n")
        try:
            while sent < 200 * LIMIT and not select.select([sock], [], [], 0)[0]:
                sock.sendall(chunk)
                sent += 0x4000
            answer = sock.recv(65536)
        except (BrokenPipeError, ConnectionResetError):
            pass
    assert sent < 200 * LIMIT  # the server answered (or hung up) long before the end
    assert not answer or answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert server.alive and server.request("GET", "/health").status_code == 200


# ---- records, jobs, results -------------------------------------------------------------------

def _record(**overrides: Any) -> str:
    record = {"workload": "dense:M=16,N=16,K=16", "target": "llvm", "template": "dense.x86",
              "template_version": 1, "config": {"index": VALID[2]},
              "result": {"costs": [1e-4], "error_kind": 0}, **overrides}
    return json.dumps(record)


def _valid_indices() -> list[int]:
    from schedule_templates.templates.base import template_by_name
    from schedule_templates.workloads import parse_workload

    space = template_by_name("dense.x86").space(parse_workload("dense:M=16,N=16,K=16"))
    return [i for i in range(space.size) if space.is_valid(i)][:3]


VALID = _valid_indices()
BAD_RECORDS = {  # the line and words its rejection must contain
    "not json": ("{nope", "expecting"),
    "a list": ("[1, 2]", "object"),
    "unknown template": (_record(template="dense.nope"), "dense.nope"),
    "other template version": (_record(template_version=7), "version"),
    "config outside the space": (_record(config={"index": 10**15}), "outside"),
    "config of wrong type": (_record(config="rm -rf /"), "config"),
    "invalid workload": (_record(workload="dense:M=0,N=1,K=1"), "out of range"),
    "negative cost": (_record(result={"costs": [-1.0], "error_kind": 0}), "positive"),
    "error kind 42": (_record(result={"costs": [], "error_kind": 42}), "42"),
    # PostgreSQL text cannot hold NUL: found by the property test on record import
    "NUL in a device key": (_record(device_key="cpu\u0000"), "nul"),
    "NUL in a uid": (_record(uid="a\u0000b"), "nul"),
}


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_a_bad_record_rejects_the_whole_import(
        live: tuple[LiveServer, dict[str, str]], case: str) -> None:
    server, tokens = live
    good = [_record(config={"index": i}, uid=f"good-{case}-{i}") for i in VALID[:2]]
    line, words = BAD_RECORDS[case]
    body = "\n".join([*good, line]) + "\n"
    before = counts(server)
    answer = server.request("POST", "/records", tokens["user"], content=body.encode())
    assert answer.status_code == 422, answer.text
    errors = answer.json()["detail"]["errors"]
    assert [e["line"] for e in errors] == [3] and words in errors[0]["reason"].lower(), errors
    assert counts(server) == before  # the two good lines were not stored either


BAD_JOBS = {
    "no op": {"workloads": ["dense"]},
    "zero size": {"workloads": ["dense:M=0,N=1,K=1"]},
    "missing parameter": {"workloads": ["dense:M=1,N=1"]},
    "unknown operator": {"workloads": ["nope:X=1"]},
    "parameter twice": {"workloads": ["dense:M=1,M=2,N=1,K=1"]},
    "absurd size": {"workloads": ["dense:M=99999999999,N=1,K=1"]},
    "window too large": {"workloads": ["conv2d:N=1,C=1,H=2,W=2,K=1,R=9,S=9"]},
    "a very long key": {"workloads": ["dense:" + "M=1," * 5000]},
    "no trials": {"workloads": ["dense:M=1,N=2,K=1"], "trials_per_task": 0},
    "unknown tuner": {"workloads": ["dense:M=1,N=2,K=1"], "tuner": "oracle"},
    "negative timeout": {"workloads": ["dense:M=1,N=2,K=1"], "options": {"run_timeout_s": -1}},
    "both model and workloads": {"workloads": ["dense:M=1,N=2,K=1"], "model_id": 1},
    "no target": {"workloads": ["dense:M=1,N=2,K=1"], "target": ""},
    "a target without templates": {"workloads": ["dense:M=1,N=2,K=1"], "target": "tpu"},
    "missing model": {"model_id": 987654},
    "id out of range": {"model_id": 2**40},
}


@pytest.mark.parametrize("case", sorted(BAD_JOBS))
def test_invalid_jobs_get_a_4xx_and_create_nothing(
        live: tuple[LiveServer, dict[str, str]], case: str) -> None:
    server, tokens = live
    before = counts(server)
    answer = server.request("POST", "/jobs", tokens["user"], json=BAD_JOBS[case])
    assert answer.status_code in (404, 422), answer.text
    assert answer.json()["detail"]
    assert counts(server) == before


def test_invalid_lookups_get_a_4xx(live: tuple[LiveServer, dict[str, str]]) -> None:
    server, _tokens = live
    for path in ("/best?workload=dense", "/best?workload=nope:X=1", "/jobs/0", "/jobs/abc",
                 f"/jobs/{2**40}", "/records?since=yesterday", "/jobs/1/history?task_id=-1"):
        answer = server.request("GET", path, token=None)
        assert 400 <= answer.status_code < 500, (path, answer.status_code, answer.text)


def test_bad_results_are_refused_and_leave_the_candidate_pending(
        live: tuple[LiveServer, dict[str, str]]) -> None:
    server, tokens = live
    server.submit(["dense:M=2,N=2,K=2"], trials=4, token=tokens["user"], device_key="bad-res")
    worker = server.call("POST", "/workers/register", tokens["worker"],
                         json={"device_key": "bad-res", "target": "llvm"})["worker_id"]
    items: list[Any] = []
    wait_until(lambda: bool(items.extend(server.call(
        "POST", f"/workers/{worker}/claim", tokens["worker"], json={"max_items": 1})["items"])
        or items), what="a claim")
    measure_id = items[0]["measure_id"]
    url = f"{server.url}/api/v1/workers/{worker}/results"
    headers = {"Authorization": f"Bearer {tokens['worker']}", "Content-Type": "application/json"}
    def body(mid: int, costs: str, kind: int = 0) -> str:  # raw text: NaN is not in JSON
        return f'{{"results": [{{"measure_id": {mid}, "costs": [{costs}], "error_kind": {kind}}}]}}'

    rejected_bodies = [  # answered 200 with the result in "rejected"
        body(measure_id, "NaN"), body(measure_id, "Infinity"), body(measure_id, "-1e-3"),
        body(measure_id, ""),
    ]
    for text in rejected_bodies:
        answer = httpx.post(url, content=text, headers=headers, timeout=30)
        assert answer.status_code == 200 and answer.json()["rejected"], (text, answer.text)
    invalid_bodies = [  # the request itself is malformed: 422
        body(measure_id, "1e-3", kind=42), body(0, "1e-3"), body(2**40, "1e-3"),
        '{"results": "all of them"}', '{"results": [',
    ]
    for text in invalid_bodies:
        answer = httpx.post(url, content=text, headers=headers, timeout=30)
        assert answer.status_code == 422, (text, answer.text)
    from sqlalchemy import create_engine, text

    engine = create_engine(server.database_url)
    with engine.connect() as conn:
        state = conn.execute(text("SELECT state FROM measurements WHERE id = :i"),
                             {"i": measure_id}).scalar_one()
    engine.dispose()
    assert state == "leased"  # still the worker's to measure
