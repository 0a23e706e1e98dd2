"""Access against a live server: every write endpoint in the published OpenAPI schema needs a
token of the right role (so routes added later are covered without editing this file), tokens
are stored hashed and compared in constant time, the server sends workers data and never code,
and a config is checked against its template's space before anything is built."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rel_live import LiveServer, create_tokens, wait_until

from schedule_templates.records import ErrorKind, MeasureOptions

WRITE = ("post", "put", "patch", "delete")
WORKLOAD = "dense:M=16,N=64,K=64"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, dict[str, str]]]:
    from tuner_service.db.migrate import upgrade

    workdir = tmp_path_factory.mktemp("access")
    url = f"sqlite:///{workdir / 'tuner.db'}"
    upgrade(url)
    tokens = create_tokens(url)
    server = LiveServer(url, workdir, queue_depth=8, batch_size=8)
    server.start()
    try:
        yield server, tokens
    finally:
        server.stop()


def write_operations(server: LiveServer) -> list[tuple[str, str]]:
    import httpx

    schema = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    ops = [(method, path) for path, item in schema["paths"].items() for method in item
           if method in WRITE]
    assert len(ops) >= 8, ops  # the schema really lists the API
    return ops


def call(server: LiveServer, method: str, path: str, token: str | None) -> int:
    concrete = re.sub(r"\{[^}]+\}", "1", path)
    url = f"{server.url}{concrete}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    import httpx

    if path.endswith("/models"):
        answer = httpx.request(method, url, headers=headers, timeout=30,
                               files={"file": ("m.onnx", b"not onnx", "application/octet-stream")})
    else:
        answer = httpx.request(method, url, headers=headers, json={}, timeout=30)
    return answer.status_code


def test_every_write_endpoint_needs_a_token_of_the_right_role(
        live: tuple[LiveServer, dict[str, str]]) -> None:
    server, tokens = live
    for method, path in write_operations(server):
        where = f"{method.upper()} {path}"
        assert call(server, method, path, None) == 401, where
        assert call(server, method, path, "tnr_not-a-real-token") == 401, where
        by_role = {role: call(server, method, path, tokens[role]) for role in tokens}
        assert by_role["admin"] not in (401, 403), (where, by_role)
        if "/workers" in path:  # the worker protocol: never a user's
            assert by_role["user"] == 403, (where, by_role)
        else:  # everything else: never a worker's
            assert by_role["worker"] == 403, (where, by_role)


def test_worker_token_cannot_submit_or_import_and_user_cannot_report(
        live: tuple[LiveServer, dict[str, str]]) -> None:
    server, tokens = live
    job = {"workloads": [WORKLOAD], "trials_per_task": 2}
    assert server.request("POST", "/jobs", tokens["worker"], json=job).status_code == 403
    record = server.request("POST", "/records", tokens["worker"], content=b"{}\n")
    assert record.status_code == 403
    worker = server.call("POST", "/workers/register", tokens["worker"],
                         json={"device_key": "k", "target": "llvm"})["worker_id"]
    results = {"results": [{"measure_id": 1, "costs": [1e-3], "error_kind": 0}]}
    answer = server.request("POST", f"/workers/{worker}/results", tokens["user"], json=results)
    assert answer.status_code == 403
    # and one worker token cannot act for a worker another token registered
    other = create_tokens(server.database_url)["worker"]
    answer = server.request("POST", f"/workers/{worker}/claim", other, json={"max_items": 1})
    assert answer.status_code == 403


def test_tokens_are_stored_only_as_sha256_digests(
        live: tuple[LiveServer, dict[str, str]]) -> None:
    server, tokens = live
    db_file = Path(server.database_url.removeprefix("sqlite:///"))
    from sqlalchemy import create_engine, text

    engine = create_engine(server.database_url)
    with engine.connect() as conn:
        stored = {r[0] for r in conn.execute(text("SELECT token_hash FROM tokens"))}
    engine.dispose()
    for secret in tokens.values():
        assert hashlib.sha256(secret.encode()).hexdigest() in stored
    # no secret anywhere in the database files, not even in the write-ahead log
    raw = b"".join(p.read_bytes() for p in db_file.parent.glob(db_file.name + "*"))
    assert raw and not [s for s in tokens.values() if s.encode() in raw]


def test_token_check_uses_a_constant_time_compare(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    from tuner_service import auth
    from tuner_service.db.engine import Database
    from tuner_service.db.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'auth.db'}"
    upgrade(url)
    compared: list[tuple[str, str]] = []
    original = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        compared.append((a, b))
        return original(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    db = Database(url)
    try:
        with db.session() as session:
            secret = auth.create_token(session, "user")[1]
        with db.session() as session:
            assert auth.authenticate(session, secret) is not None
            assert auth.authenticate(session, secret + "x") is None
    finally:
        db.dispose()
    assert compared and all(a == b == auth.hash_token(secret) for a, b in compared)


ITEM_KEYS = {"measure_id", "template", "template_version", "workload", "target", "config",
             "options", "threads"}


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def test_claims_carry_names_and_numbers_never_code(
        live: tuple[LiveServer, dict[str, str]]) -> None:
    from schedule_templates.templates.base import all_templates, template_by_name
    from schedule_templates.workloads import parse_workload

    server, tokens = live
    server.submit([WORKLOAD], trials=4, token=tokens["user"], device_key="code-check")
    worker = server.call("POST", "/workers/register", tokens["worker"],
                         json={"device_key": "code-check", "target": "llvm"})["worker_id"]
    items = server.call("POST", f"/workers/{worker}/claim", tokens["worker"],
                        json={"max_items": 4, "wait_s": 5})["items"]
    assert items
    known = {t.name for t in all_templates()}
    option_fields = set(MeasureOptions().to_json())
    for item in items:
        assert set(item) == ITEM_KEYS
        assert item["template"] in known and item["workload"] == WORKLOAD
        assert set(item["config"]) <= {"index", "entity"}
        assert set(item["options"]) <= option_fields
        # the worker rebuilds the config from its own template: the item only names a point
        space = template_by_name(item["template"]).space(parse_workload(WORKLOAD))
        assert space.from_json(item["config"]).index == item["config"]["index"]
        assert max(len(s) for s in _strings(item)) < 64  # names and numbers, no source text


def test_server_refuses_to_hand_out_a_config_outside_its_space(
        live: tuple[LiveServer, dict[str, str]]) -> None:
    """A row tampered with in the database is recorded as an instantiation error at claim."""
    from sqlalchemy import create_engine, text

    server, tokens = live
    job_id = server.submit([WORKLOAD], trials=2, token=tokens["user"], device_key="tamper")
    engine = create_engine(server.database_url)
    rows_sql = text("""SELECT m.id FROM measurements m JOIN job_tasks t ON t.id = m.job_task_id
                       WHERE t.job_id = :j AND m.state = 'queued' ORDER BY m.id""")
    try:
        def queued() -> list[int]:
            with engine.connect() as conn:
                return [r[0] for r in conn.execute(rows_sql, {"j": job_id})]

        wait_until(lambda: len(queued()) == 2, what="queued candidates")
        bad = queued()[0]
        with engine.begin() as conn:
            conn.execute(text("UPDATE measurements SET config = :c WHERE id = :i"),
                         {"c": '{"index": 10000000000}', "i": bad})
        worker = server.call("POST", "/workers/register", tokens["worker"],
                             json={"device_key": "tamper", "target": "llvm"})["worker_id"]
        items = server.call("POST", f"/workers/{worker}/claim", tokens["worker"],
                            json={"max_items": 2})["items"]
        assert len(items) == 1 and items[0]["measure_id"] != bad
        with engine.connect() as conn:
            state, kind = conn.execute(
                text("SELECT state, error_kind FROM measurements WHERE id = :i"), {"i": bad}).one()
    finally:
        engine.dispose()
    assert (state, kind) == ("done", int(ErrorKind.INSTANTIATION))


BAD_CONFIGS = [
    ({"index": 10**12}, "dense.x86", 1, "llvm"),  # outside the space
    ({"index": -1}, "dense.x86", 1, "llvm"),
    ({"index": "0"}, "dense.x86", 1, "llvm"),
    ({"entity": [["tile_m", "sp", [3, 3, 3]]]}, "dense.x86", 1, "llvm"),  # not a split of 16
    ({"entity": [["no_such_knob", "sp", [1]]]}, "dense.x86", 1, "llvm"),
    ({"index": 0, "entity": "rm -rf /"}, "dense.x86", 1, "llvm"),
    ({"index": 0}, "dense.x86", 99, "llvm"),  # another template version
    ({"index": 0}, "conv2d.x86", 1, "llvm"),  # a template for another operator
    ({"index": 0}, "dense.x86", 1, "cuda"),  # a template for another target
]


@pytest.mark.parametrize(("config", "template", "version", "target"), BAD_CONFIGS)
def test_worker_checks_the_config_before_building_anything(
        config: dict[str, Any], template: str, version: int, target: str) -> None:
    from schedule_templates.protocol import Candidate, ClaimItem, Target
    from workers.backends.llvm import LlvmBackend
    from workers.measure.runner import measure_task

    class Recording(LlvmBackend):
        built = 0

        # workers build through the compile-cache path
        def compile_cached(self, task: ClaimItem, resolved: Any, code: bytes | None) -> Any:
            Recording.built += 1
            return super().compile_cached(task, resolved, code)

    def task(cfg: dict[str, Any], name: str = "dense.x86", ver: int = 1,
             tgt: str = "llvm") -> ClaimItem:
        return ClaimItem(1, Candidate(name, "dense:M=16,N=16,K=16", cfg, ver), Target.parse(tgt),
                         MeasureOptions(repeat=1, min_repeat_ms=0.0), threads=1)

    backend = Recording()
    try:
        result = measure_task(backend, task(config, template, version, target))
        assert result.error is ErrorKind.INSTANTIATION, result
        assert Recording.built == 0
        from schedule_templates.templates.base import template_by_name
        from schedule_templates.workloads import parse_workload

        good = template_by_name("dense.x86").default_config(parse_workload("dense:M=16,N=16,K=16"))
        assert measure_task(backend, task(good.to_json())).ok  # the spy does see a real build
        assert Recording.built == 1
    finally:
        backend.close()
