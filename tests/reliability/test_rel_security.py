"""The adversarial corpus of issue 15 against the app on SQLite and PostgreSQL: forged results,
hostile JSON (NaN, 1e400, lone surrogates, NUL, nesting), integers and timestamps out of range,
jobs over the resource budget, and cancelling someone else's job. Every answer is a clear 4xx or
a per-result status, never a 5xx, and nothing forged or half-stored reaches the database."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

WORKLOAD = "dense:M=8,N=16,K=32"


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def state(client: TestClient) -> Any:
    """The app's state (settings, database, driver)."""
    return client.app.state  # type: ignore[attr-defined]


@pytest.fixture
def app(any_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    from rel_live import create_tokens

    from tuner_service.app import create_app
    from tuner_service.settings import Settings

    settings = Settings(database_url=any_url, data_dir=tmp_path / "data", lease_s=30.0,
                        heartbeat_s=5.0, driver_interval_s=0.05, batch_size=4, queue_depth=8,
                        claim_max_wait_s=0.0)
    tokens = create_tokens(any_url)
    tokens["admin"] = _token(any_url, "admin")
    with TestClient(create_app(settings)) as client:
        yield client, tokens


def _token(url: str, role: str, device_key: str | None = None) -> str:
    from tuner_service import auth
    from tuner_service.db.engine import Database

    db = Database(url)
    try:
        with db.session() as session:
            return auth.create_token(session, role, f"sec-{role}", device_key=device_key)[1]
    finally:
        db.dispose()


def _register(client: TestClient, token: str, device_key: str = "sec-cpu") -> str:
    answer = client.post("/api/v1/workers/register", headers=bearer(token),
                         json={"device_key": device_key, "target": "llvm"})
    assert answer.status_code == 201, answer.text
    return f"/api/v1/workers/{answer.json()['worker_id']}"


def _claim_one(client: TestClient, token: str, worker: str) -> dict[str, Any]:
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        items = client.post(f"{worker}/claim", headers=bearer(token),
                            json={"max_items": 1}).json()["items"]
        if items:
            return dict(items[0])
        time.sleep(0.05)
    raise AssertionError("nothing to claim")


def _result(measure_id: int, cost: float) -> dict[str, Any]:
    return {"results": [{"measure_id": measure_id, "costs": [cost], "error_kind": 0}]}


def test_forged_results_are_refused_and_the_owner_still_reports(
        app: tuple[TestClient, dict[str, str]]) -> None:
    client, tokens = app
    job = client.post("/api/v1/jobs", headers=bearer(tokens["user"]),
                      json={"workloads": [WORKLOAD], "trials_per_task": 4,
                            "device_key": "sec-cpu"}).json()["job_id"]
    owner = _register(client, tokens["worker"])
    item = _claim_one(client, tokens["worker"], owner)
    forger_token = _token(state(client).settings.resolved_database_url, "worker")
    forger = _register(client, forger_token)
    elsewhere = _register(client, forger_token, device_key="other-device")
    for worker in (forger, elsewhere):  # another worker, another device key: not theirs
        forged = client.post(f"{worker}/results", headers=bearer(forger_token),
                             json=_result(item["measure_id"], 1e-12))
        assert forged.status_code == 200, forged.text
        status = forged.json()["statuses"][0]
        assert status["status"] == "not_leased_by_you" and not forged.json()["accepted"]
    answer = client.post(f"{owner}/results", headers=bearer(tokens["worker"]),
                         json=_result(item["measure_id"], 1e-3))
    assert answer.json()["accepted"] == [item["measure_id"]], answer.text
    again = client.post(f"{owner}/results", headers=bearer(tokens["worker"]),
                        json=_result(item["measure_id"], 1e-3))
    assert again.json()["statuses"][0]["status"] == "duplicate"
    late = client.post(f"{forger}/results", headers=bearer(forger_token),
                       json=_result(item["measure_id"], 1e-12))
    assert late.json()["statuses"][0]["status"] == "not_leased_by_you"
    task = client.get(f"/api/v1/jobs/{job}").json()["tasks"][0]
    assert task["best_latency_s"] == pytest.approx(1e-3)  # the forged 65 PFLOPS never got in
    assert task["trials_done"] == 1


def test_a_result_after_the_lease_expired_is_refused_as_expired(
        app: tuple[TestClient, dict[str, str]]) -> None:
    from sqlalchemy import text

    client, tokens = app
    client.post("/api/v1/jobs", headers=bearer(tokens["user"]),
                json={"workloads": [WORKLOAD], "trials_per_task": 2, "device_key": "sec-cpu"})
    worker = _register(client, tokens["worker"])
    item = _claim_one(client, tokens["worker"], worker)
    state(client).driver.stop()  # so it does not requeue the lapsed lease in between
    state(client).driver = None
    db = state(client).db
    with db.engine.begin() as conn:  # the lease lapses (as if the worker stalled)
        conn.execute(text("UPDATE measurements SET lease_expires_at = :t WHERE id = :i"),
                     {"t": "2000-01-01 00:00:00", "i": item["measure_id"]})
    answer = client.post(f"{worker}/results", headers=bearer(tokens["worker"]),
                         json=_result(item["measure_id"], 1e-3)).json()
    assert answer["statuses"][0]["status"] == "expired"
    assert answer["rejected"][0]["measure_id"] == item["measure_id"]  # the spool drops it


def test_a_bound_worker_token_registers_only_its_device_key(
        app: tuple[TestClient, dict[str, str]]) -> None:
    client, _tokens = app
    bound = _token(state(client).settings.resolved_database_url, "worker", "gpu-1")
    _register(client, bound, device_key="gpu-1")
    answer = client.post("/api/v1/workers/register", headers=bearer(bound),
                         json={"device_key": "gpu-2", "target": "llvm"})
    assert answer.status_code == 403 and "gpu-1" in answer.json()["detail"]


HOSTILE_REGISTRATIONS = {
    "hardware nested 900 deep": '{"device_key":"k","target":"llvm","hardware":'
                                + '{"a":' * 900 + "1" + "}" * 900 + "}",
    "hardware of 1 MB": json.dumps({"device_key": "k", "target": "llvm",
                                    "hardware": {"blob": "x" * 1_000_000}}),
    "NaN in software": '{"device_key":"k","target":"llvm","software":{"v":NaN}}',
    "Infinity in hardware": '{"device_key":"k","target":"llvm","hardware":{"f":Infinity}}',
    "1e400 in hardware": '{"device_key":"k","target":"llvm","hardware":{"f":1e400}}',
    "integer beyond 64 bits": '{"device_key":"k","target":"llvm","hardware":{"f":'
                              + "9" * 30 + "}}",
    "lone surrogate": '{"device_key":"k","target":"llvm","name":"\\ud800"}',
    "lone surrogate in a key": '{"device_key":"k","target":"llvm","hardware":{"\\udfff":1}}',
    "NUL in the device key": '{"device_key":"k\\u0000","target":"llvm"}',
    "NUL in hardware": '{"device_key":"k","target":"llvm","hardware":{"s":"a\\u0000b"}}',
    "JSON nested 3000 deep": "[" * 3000 + "]" * 3000,
    "name as NaN": '{"device_key":"k","target":"llvm","name":NaN}',
}


@pytest.mark.parametrize("case", sorted(HOSTILE_REGISTRATIONS))
def test_hostile_worker_registrations_get_a_422_and_store_nothing(
        app: tuple[TestClient, dict[str, str]], case: str) -> None:
    client, tokens = app
    answer = client.post("/api/v1/workers/register", content=HOSTILE_REGISTRATIONS[case],
                         headers={**bearer(tokens["worker"]),
                                  "Content-Type": "application/json"})
    assert answer.status_code == 422, (case, answer.status_code, answer.text[:300])
    assert answer.json()["detail"]
    assert client.get("/api/v1/workers").json() == []
    assert client.get("/api/v1/dashboard/workers").status_code == 200


def test_hostile_results_are_refused_per_result_or_whole_never_5xx(
        app: tuple[TestClient, dict[str, str]]) -> None:
    client, tokens = app
    client.post("/api/v1/jobs", headers=bearer(tokens["user"]),
                json={"workloads": [WORKLOAD], "trials_per_task": 2, "device_key": "sec-cpu"})
    worker = _register(client, tokens["worker"])
    mid = _claim_one(client, tokens["worker"], worker)["measure_id"]
    headers = {**bearer(tokens["worker"]), "Content-Type": "application/json"}
    per_result = [f'{{"results":[{{"measure_id":{mid},"costs":[{c}]}}]}}'
                  for c in ("NaN", "Infinity", "1e400", "-1")]
    for body in per_result:  # the measurement is refused, the request is fine
        answer = client.post(f"{worker}/results", content=body, headers=headers)
        assert answer.status_code == 200, (body, answer.text)
        assert answer.json()["statuses"][0]["status"] == "rejected", body
    whole = [
        f'{{"results":[{{"measure_id":{mid},"costs":[1e-3],"wall_time_s":Infinity}}]}}',
        f'{{"results":[{{"measure_id":{mid},"costs":[1e-3],"compile_time_s":NaN}}]}}',
        f'{{"results":[{{"measure_id":{mid},"costs":[1e-3],"error_kind":1e400}}]}}',
        f'{{"results":[{{"measure_id":{mid},"costs":[1e-3],"error_kind":NaN}}]}}',
        '{"results":[{"measure_id":' + "9" * 25 + ',"costs":[1e-3]}]}',
        '{"results":[{"measure_id":"\\ud800","costs":[1e-3]}]}',
    ]
    for body in whole:
        answer = client.post(f"{worker}/results", content=body, headers=headers)
        assert answer.status_code == 422, (body, answer.text)
        json.dumps(answer.json(), allow_nan=False)  # plain JSON, whatever came in
    # a NUL or NaN in context fields is cleaned, and the measurement counts
    body = (f'{{"results":[{{"measure_id":{mid},"costs":[1e-3],"error_message":"a\\u0000b",'
            f'"peak_gflops":NaN}}]}}')
    answer = client.post(f"{worker}/results", content=body, headers=headers)
    assert answer.status_code == 200 and answer.json()["accepted"] == [mid], answer.text
    records = client.get("/api/v1/records").text
    assert all(json.loads(line) for line in records.splitlines())  # standard JSON out


@pytest.mark.parametrize("path", [
    f"/api/v1/dashboard/jobs/1?since_id={2**63}",
    f"/api/v1/dashboard/jobs/1?since_id={2**70}",
    f"/api/v1/jobs/1/history?task_id=1&after={2**63}",
    "/api/v1/records?since=9999-12-31T23:59:59-14:00",
    "/api/v1/records?since=0001-01-01T00:00:00%2B14:00",
    f"/api/v1/best?workload={'dense:M=1,' * 200}",
    "/api/v1/tuning-log?workload=" + "x" * 600,
])
def test_out_of_range_query_values_get_a_4xx(app: tuple[TestClient, dict[str, str]],
                                             path: str) -> None:
    client, _tokens = app
    answer = client.get(path)
    assert 400 <= answer.status_code < 500, (path, answer.status_code, answer.text[:300])


def test_imported_timestamps_are_bounded_and_kept_time_zone_aware(
        app: tuple[TestClient, dict[str, str]]) -> None:
    from schedule_templates.templates.base import get_template
    from schedule_templates.workloads import parse_workload

    client, tokens = app
    template = get_template("dense", "llvm")
    config = template.default_config(parse_workload(WORKLOAD))
    record = {"workload": WORKLOAD, "target": "llvm", "template": template.name,
              "template_version": int(template.version), "config": config.to_json(),
              "result": {"costs": [1e-3], "error_kind": 0}}
    headers = bearer(tokens["user"])
    for stamp in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", 1e300, "nope"):
        line = json.dumps({**record, "uid": f"bad-{stamp}", "timestamp": stamp})
        answer = client.post("/api/v1/records", content=line, headers=headers)
        assert answer.status_code == 422, (stamp, answer.text)
    line = json.dumps({**record, "uid": "tz", "timestamp": "2026-01-01T12:00:00+14:00"})
    assert client.post("/api/v1/records", content=line, headers=headers).status_code == 200
    exported = [json.loads(x) for x in client.get("/api/v1/records").text.splitlines()]
    assert [r["timestamp"] for r in exported] == ["2025-12-31T22:00:00+00:00"]
    assert client.get("/api/v1/records",
                      params={"since": "2026-01-01T06:00:00+09:00"}).text.strip()
    assert not client.get("/api/v1/records",
                          params={"since": "2026-01-01T00:00:00+01:00"}).text.strip()


@pytest.mark.parametrize(("body", "limit"), [
    ({"workloads": ["batch_matmul:B=1024,M=1024,N=1024,K=1024"]}, "bytes per tensor"),
    ({"workloads": ["dense:M=16384,N=16384,K=16384"]}, "FLOPs per candidate"),
    ({"options": {"run_timeout_s": 3600}}, "run_timeout_s"),
    ({"options": {"number": 1000000}}, "number"),
    ({"options": {"repeat": 1000}}, "repeat"),
    ({"options": {"build_timeout_s": 3600}}, "build_timeout_s"),
])
def test_jobs_over_the_resource_budget_get_a_422_naming_the_limit(
        app: tuple[TestClient, dict[str, str]], body: dict[str, Any], limit: str) -> None:
    client, tokens = app
    job = {"workloads": [WORKLOAD], "trials_per_task": 2, **body}
    answer = client.post("/api/v1/jobs", headers=bearer(tokens["user"]), json=job)
    assert answer.status_code == 422, answer.text
    assert limit in answer.json()["detail"] and "TUNER_BUDGET_" in answer.json()["detail"]
    assert client.get("/api/v1/jobs").json() == []


def test_only_the_owner_or_an_admin_cancels(app: tuple[TestClient, dict[str, str]]) -> None:
    client, tokens = app
    job = client.post("/api/v1/jobs", headers=bearer(tokens["user"]),
                      json={"workloads": [WORKLOAD], "trials_per_task": 2}).json()["job_id"]
    other = _token(state(client).settings.resolved_database_url, "user")
    assert client.post(f"/api/v1/jobs/{job}/cancel", headers=bearer(other)).status_code == 403
    assert client.post(f"/api/v1/jobs/{job}/cancel",
                       headers=bearer(tokens["worker"])).status_code == 403
    answer = client.post(f"/api/v1/jobs/{job}/cancel", headers=bearer(tokens["admin"]))
    assert answer.status_code == 200 and answer.json()["status"] == "cancelled"


@pytest.mark.parametrize("body", [
    "[" * 3000 + "]" * 3000, '{"format":"tuner-pack","entries":[{"mean_cost":NaN}]}',
    '{"format":"tuner-pack","device_class":"\\ud800"}', '{"format":1e400}',
])
def test_hostile_pack_imports_get_a_422(app: tuple[TestClient, dict[str, str]],
                                        body: str) -> None:
    client, tokens = app
    answer = client.post("/api/v1/packs", content=body, headers=bearer(tokens["user"]))
    assert answer.status_code == 422, answer.text[:300]


def test_a_worker_row_stored_before_the_checks_does_not_break_the_lists(
        app: tuple[TestClient, dict[str, str]]) -> None:
    from sqlalchemy import text

    client, _tokens = app
    deep = '{"a":' * 900 + "1" + "}" * 900
    with state(client).db.engine.begin() as conn:  # as an older server let it in
        conn.execute(text("INSERT INTO workers (name, device_key, target, hardware, software) "
                          "VALUES ('old', 'k', 'llvm', :h, '{}')"), {"h": deep})
    listed = client.get("/api/v1/workers")
    assert listed.status_code == 200 and "unreadable" in listed.json()[0]["hardware"]
    assert client.get("/api/v1/dashboard/workers").status_code == 200
