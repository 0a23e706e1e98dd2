"""The dashboard's JSON reads, pages and assets (TestClient on SQLite and PostgreSQL)."""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from dashboard_support import WORKLOADS, ProtocolWorker, bearer, submit
from fastapi.testclient import TestClient
from sqlalchemy import event

from tuner_service.settings import Settings


def snapshot(client: TestClient, job_id: int, since_id: int = 0) -> dict[str, Any]:
    answer = client.get(f"/api/v1/dashboard/jobs/{job_id}", params={"since_id": since_id})
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_job_snapshot_has_described_tasks_points_and_errors(
        client: TestClient, tokens: dict[str, str]) -> None:
    job_id = submit(client, tokens["user"], trials=6)
    worker = ProtocolWorker(client, tokens["worker"], peak_gflops=50.0)
    reported = worker.report(worker.claim_at_least(6), errors=2)

    body = snapshot(client, job_id)
    assert body["job_id"] == job_id and body["status"] == "running"
    assert body["point_fields"] == ["id", "task_id", "latency_s", "error_kind", "finished_at",
                                    "config_index"]
    assert sorted(p[0] for p in body["points"]) == sorted(reported)
    errors = [p for p in body["points"] if p[3] != 0]
    assert len(errors) == 2 and all(p[2] is None for p in errors)
    assert all(body["errors"][str(p[0])].startswith("crashed") for p in errors)
    tasks = {t["workload"]: t for t in body["tasks"]}
    assert set(tasks) == set(WORKLOADS)
    conv = tasks[WORKLOADS[1]]
    assert conv["description"] == "conv2d 8->8 channels, 8x8 input, 3x3 pad 1"
    assert conv["weight"] == 1 and conv["trials_budget"] == 6
    done = sum(t["trials_done"] for t in body["tasks"])
    assert done == 6
    for task in body["tasks"]:
        if task["best_latency_s"] is None:
            continue
        expected = task["flops"] / task["best_latency_s"] / 1e9
        assert task["best_gflops"] == pytest.approx(expected)
        assert task["peak_gflops"] == 50.0
        assert task["fraction_of_peak"] == pytest.approx(expected / 50.0)
        # the 3x3 conv offers Winograd (its effective GFLOPS may exceed the peak); dense does not
        if task["op"] == "conv2d":
            assert task["best_algorithm"] in ("direct", "winograd2", "winograd4")
        else:
            assert task["best_algorithm"] is None


def test_incremental_reads_never_lose_results_reported_out_of_order(
        client: TestClient, tokens: dict[str, str]) -> None:
    job_id = submit(client, tokens["user"], trials=8)
    worker = ProtocolWorker(client, tokens["worker"])
    items = sorted(worker.claim_at_least(6), key=lambda i: i["measure_id"])
    worker.report(items[3:])  # the newest finish first
    seen: set[int] = set()
    first = snapshot(client, job_id)
    seen |= {p[0] for p in first["points"]}
    assert first["cursor"] < items[0]["measure_id"], "the cursor passed an unfinished item"

    worker.report(items[:3])
    second = snapshot(client, job_id, first["cursor"])
    assert all(p[0] > first["cursor"] for p in second["points"])
    seen |= {p[0] for p in second["points"]}
    assert seen == {i["measure_id"] for i in items}

    third = snapshot(client, job_id, second["cursor"])
    assert {p[0] for p in third["points"]} <= seen, "only redelivered ids, nothing new"


def _insert_job(db: Any, tasks: int, per_task: int) -> int:
    """A job with ``tasks`` tasks of ``per_task`` finished measurements, written directly."""
    from sqlalchemy import insert

    from tuner_service.db.models import Job, JobTask, Measurement, Task

    now = dt.datetime.now(dt.UTC)
    with db.session() as session:
        job = Job(target="llvm", trials_per_task=per_task, tuner="random", status="running",
                  started_at=now)
        session.add(job)
        session.flush()
        rows = []
        for n in range(tasks):
            key = f"dense:M={n + 1},N=16,K=32"
            task = Task(workload_key=key, op="dense", weight=1, flops=2 * (n + 1) * 16 * 32)
            session.add(task)
            session.flush()
            jt = JobTask(job_id=job.id, task_id=task.id, template="dense.x86", template_version=1,
                         trials_budget=per_task, trials_done=per_task, best_cost=1e-6,
                         status="running")
            session.add(jt)
            session.flush()
            rows += [{
                "uid": uuid.uuid4().hex, "job_task_id": jt.id, "config_index": i,
                "config": {"index": i}, "template": "dense.x86", "template_version": 1,
                "workload_key": key, "target": "llvm", "state": "done",
                "mean_cost": 1e-6 * (1 + i % 7) if i % 10 else None,
                "error_kind": 0 if i % 10 else 5, "error_message": "" if i % 10 else "wrong",
                "finished_at": now + dt.timedelta(milliseconds=i),
            } for i in range(per_task)]
        session.execute(insert(Measurement), rows)
        return job.id


@pytest.fixture
def quiet_client(settings: Settings, make_client: Callable[[Settings], TestClient]
                 ) -> Iterator[TestClient]:
    """An app without the job driver, and a counter of the SQL statements it runs."""
    client = make_client(settings.with_overrides(run_driver=False))
    statements: list[str] = []
    engine = client.app.state.db.engine  # type: ignore[attr-defined]

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    client.statements = statements  # type: ignore[attr-defined]
    yield client
    event.remove(engine, "before_cursor_execute", count)


def test_statement_count_does_not_grow_with_tasks_or_measurements(
        quiet_client: TestClient) -> None:
    db = quiet_client.app.state.db  # type: ignore[attr-defined]
    small, big = _insert_job(db, 2, 3), _insert_job(db, 12, 300)
    statements: list[str] = quiet_client.statements  # type: ignore[attr-defined]
    counts = {}
    for name, job_id in (("small", small), ("big", big)):
        statements.clear()
        body = snapshot(quiet_client, job_id)
        counts[name] = len(statements)
        assert len(body["points"]) == len(body["tasks"]) * (3 if name == "small" else 300)
    assert counts["big"] == counts["small"] <= 8, counts

    statements.clear()
    assert quiet_client.get("/api/v1/dashboard/jobs").status_code == 200
    assert len(statements) <= 4, statements
    for _ in range(5):
        _insert_job(db, 3, 1)
    statements.clear()
    jobs = quiet_client.get("/api/v1/dashboard/jobs").json()["jobs"]
    assert len(jobs) == 7 and len(statements) <= 4, statements


def test_a_large_backlog_arrives_in_pages(quiet_client: TestClient,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner_service.dashboard import queries

    monkeypatch.setattr(queries, "MAX_POINTS", 50)
    job_id = _insert_job(quiet_client.app.state.db, 3, 40)  # type: ignore[attr-defined]
    cursor, ids, pages = 0, set(), 0
    while True:
        body = snapshot(quiet_client, job_id, cursor)
        ids |= {p[0] for p in body["points"]}
        cursor, pages = body["cursor"], pages + 1
        if not body["more"]:
            break
    assert len(ids) == 120 and pages == 3


def test_jobs_overview_shows_progress_and_the_model_estimate(
        client: TestClient, tokens: dict[str, str]) -> None:
    job_id = submit(client, tokens["user"], trials=4,
                    workloads=[WORKLOADS[0], WORKLOADS[0], WORKLOADS[1]])
    worker = ProtocolWorker(client, tokens["worker"])
    worker.report(worker.claim_at_least(8))
    worker.finish(job_id)
    jobs = client.get("/api/v1/dashboard/jobs").json()["jobs"]
    job = next(j for j in jobs if j["job_id"] == job_id)
    assert job["tasks"] == 2 and job["trials_done"] == job["trials_budget"] == 8
    status = client.get(f"/api/v1/jobs/{job_id}").json()
    expected = sum(t["weight"] * t["best_latency_s"] for t in status["tasks"])
    assert job["estimated_latency_s"] == pytest.approx(expected)
    assert job["finished_at"] and job["status"] == "done"


def test_jobs_overview_counts_each_layer_once_for_both_layouts(
        client: TestClient, tokens: dict[str, str]) -> None:
    """A job tuned for ``--layout auto`` holds a conv task and its blocked twin: the estimate
    is the faster plan's sum (the dense task in both), not every task's."""
    twin = "conv2d_nchwc:N=1,C=8,H=8,W=8,K=8,R=3,S=3,pad=1,block=8"
    job_id = submit(client, tokens["user"], trials=2, workloads=[*WORKLOADS, twin])
    worker = ProtocolWorker(client, tokens["worker"])
    worker.report(worker.claim_at_least(6))
    worker.finish(job_id)
    job = next(j for j in client.get("/api/v1/dashboard/jobs").json()["jobs"]
               if j["job_id"] == job_id)
    status = client.get(f"/api/v1/jobs/{job_id}").json()
    cost = {t["workload"]: t["weight"] * t["best_latency_s"] for t in status["tasks"]}
    assert len(cost) == 3
    dense, conv = cost[WORKLOADS[0]], cost[WORKLOADS[1]]
    assert job["estimated_latency_s"] == pytest.approx(dense + min(conv, cost[twin]))
    assert job["estimated_latency_s"] < sum(cost.values())


def test_workers_show_throughput_and_error_rate_by_kind(
        client: TestClient, tokens: dict[str, str]) -> None:
    submit(client, tokens["user"], trials=6)
    worker = ProtocolWorker(client, tokens["worker"])
    worker.report(worker.claim_at_least(5), errors=2)
    body = client.get("/api/v1/dashboard/workers").json()
    row = next(w for w in body["workers"] if w["worker_id"] == worker.worker_id)
    assert row["online"] is True and row["device_key"] == "local"
    assert row["measured_last_hour"] == 5
    assert row["errors_last_hour"] == {"4": 2}
    assert row["candidates_per_min"] == pytest.approx(5 / (body["rate_window_s"] / 60))


def test_tuning_log_is_described_filtered_and_downloadable(
        client: TestClient, tokens: dict[str, str]) -> None:
    job_id = submit(client, tokens["user"], trials=4)
    worker = ProtocolWorker(client, tokens["worker"])
    worker.report(worker.claim_at_least(8))
    worker.finish(job_id)  # a job's bests reach the log once re-measured
    body = client.get("/api/v1/dashboard/tuning-log").json()
    assert body["ops"] == ["conv2d", "dense"] and body["targets"] == ["llvm"]
    assert {e["workload"] for e in body["entries"]} == set(WORKLOADS)
    assert all(e["job_id"] == job_id and e["description"] for e in body["entries"])
    only = client.get("/api/v1/dashboard/tuning-log", params={"op": "dense"}).json()["entries"]
    assert [e["workload"] for e in only] == [WORKLOADS[0]]
    # the page's download link: the existing records export, filtered the same way
    records = client.get("/api/v1/records", params={"workload": WORKLOADS[0], "target": "llvm"})
    lines = [json.loads(line) for line in records.text.splitlines()]
    assert records.status_code == 200 and sum(r["purpose"] == "tune" for r in lines) == 4


def test_reads_need_a_token_when_the_server_says_so(
        settings: Settings, make_client: Callable[[Settings], TestClient],
        tokens: dict[str, str]) -> None:
    client = make_client(settings.with_overrides(read_requires_token=True, run_driver=False))
    for path in ("/api/v1/dashboard/jobs", "/api/v1/dashboard/workers",
                 "/api/v1/dashboard/tuning-log"):
        assert client.get(path).status_code == 401
        assert client.get(path, headers=bearer(tokens["user"])).status_code == 200
        # a worker token reads what workers need, not the jobs and workers of every user
        assert client.get(path, headers=bearer(tokens["worker"])).status_code == 403
    # the page shell holds no data: it loads without a token, then asks for one
    page = client.get("/jobs/1")
    assert page.status_code == 200 and 'id="token-form"' in page.text


def test_unknown_job_is_a_404(client: TestClient) -> None:
    answer = client.get("/api/v1/dashboard/jobs/999")
    assert answer.status_code == 404 and "999" in answer.json()["detail"]


def _assets(client: TestClient) -> dict[str, str]:
    """Every file the shell loads, following the JS module imports."""
    shell = client.get("/").text
    todo = re.findall(r'(?:src|href)="(/dashboard/static/[^"]+)"', shell)
    seen: dict[str, str] = {}
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        answer = client.get(path)
        assert answer.status_code == 200, path
        seen[path] = answer.text
        base = path.rsplit("/", 1)[0]
        todo += [f"{base}/{name}" for name in re.findall(r'from "\./([\w.-]+)"', answer.text)]
    return seen


def test_pages_and_every_asset_are_served_by_the_server(client: TestClient) -> None:
    for path in ("/", "/jobs/3", "/workers", "/tuning-log"):
        answer = client.get(path)
        assert answer.status_code == 200 and "text/html" in answer.headers["content-type"]
        assert '<script type="module" src="/dashboard/static/js/app.js">' in answer.text
    assets = _assets(client)
    names = {path.rsplit("/", 1)[1] for path in assets}
    assert {"app.css", "app.js", "charts.js", "job.js", "jobs.js", "workers.js",
            "log.js"} <= names
    for path, text in assets.items():  # offline: nothing is fetched from elsewhere
        assert not re.search(r"(?:https?:)?//[\w.-]+\.\w+/", text), path
