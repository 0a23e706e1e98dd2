"""``GET /metrics``: Prometheus text that a scraper parses, counters that count each stored
result once (on commit), and gauges that match the database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from ops_live import ADMIN_TOKEN, WORKER_TOKEN, LiveServer, wait_until
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from tuner_service.api.metrics import ServiceMetrics
from tuner_service.db.engine import Database
from tuner_service.db.models import Measurement
from tuner_service.errors import InvalidInputError

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(server: LiveServer, token: str | None = None) -> Samples:
    answer = httpx.get(f"{server.url}/metrics", timeout=30,
                       headers={"Authorization": f"Bearer {token}"} if token else {})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(answer.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items()
               if n == name and all(dict(ls).get(k) == want for k, want in labels.items()))


def queued_in_db(server: LiveServer, state: str) -> int:
    db = Database(server.settings.resolved_database_url)
    try:
        with db.session() as session:
            return int(session.scalar(select(func.count()).select_from(Measurement)
                                      .where(Measurement.state == state)) or 0)
    finally:
        db.dispose()


def result(item: dict[str, Any], error_kind: int = 0) -> dict[str, Any]:
    return {"measure_id": item["measure_id"], "costs": [] if error_kind else [1e-4, 1.1e-4],
            "error_kind": error_kind, "error_message": "wrong" if error_kind else "",
            "compile_time_s": 0.01, "wall_time_s": 0.02, "peak_gflops": None}


def test_metrics_follow_a_job_through_the_queue(live_server: LiveServer) -> None:
    before = scrape(live_server)
    assert total(before, "tuner_database_up") == 1
    assert total(before, "tuner_measurement_results_total") == 0
    assert ("tuner_measurement_results_total", (("error", "wrong_answer"),)) in before
    assert total(before, "tuner_workers_online") == 0
    assert total(before, "tuner_jobs") == 0
    assert total(before, "process_cpu_seconds_total") > 0

    worker = live_server.call("POST", "/api/v1/workers/register", token=WORKER_TOKEN, json={
        "device_key": "metrics-box", "target": "llvm", "name": "w", "hardware": {},
        "software": {}})["worker_id"]
    job = live_server.call("POST", "/api/v1/jobs", json={
        "workloads": ["dense:M=32,N=32,K=32"], "target": "llvm", "device_key": "metrics-box",
        "trials_per_task": 4, "tuner": "random"})["job_id"]
    wait_until(lambda: queued_in_db(live_server, "queued") == 4, what="4 queued candidates")

    queued = scrape(live_server)
    assert total(queued, "tuner_queue_measurements", state="queued",
                 device_key="metrics-box", target="llvm") == 4
    assert total(queued, "tuner_queue_measurements", state="leased") == 0
    assert total(queued, "tuner_workers_online", device_key="metrics-box") == 1
    assert total(queued, "tuner_jobs", status="queued") + total(
        queued, "tuner_jobs", status="running") == 1

    items = live_server.call("POST", f"/api/v1/workers/{worker}/claim", token=WORKER_TOKEN,
                             json={"max_items": 3, "wait_s": 0})["items"]
    assert len(items) == 3
    leased = scrape(live_server)
    assert total(leased, "tuner_queue_measurements", state="leased") == 3
    assert total(leased, "tuner_queue_measurements", state="queued") == 1

    report = [result(items[0]), result(items[1]), result(items[2], error_kind=5)]
    for _ in range(2):  # the second report is a duplicate and must not count again
        live_server.call("POST", f"/api/v1/workers/{worker}/results", token=WORKER_TOKEN,
                         json={"results": report})
    after = scrape(live_server)
    assert total(after, "tuner_measurement_results_total", error="none") == 2
    assert total(after, "tuner_measurement_results_total", error="wrong_answer") == 1
    assert total(after, "tuner_measurement_results_total") == 3
    assert total(after, "tuner_queue_measurements", state="leased") == 0
    assert live_server.call("GET", f"/api/v1/jobs/{job}")["tasks"][0]["trials_done"] == 3


def test_an_aborted_transaction_counts_nothing(migrated_url: str) -> None:
    from schedule_templates.records import ErrorKind, MeasureResult
    from tuner_service.jobs.results import store_result

    db = Database(migrated_url)
    metrics = ServiceMetrics(db, heartbeat_s=5.0)
    try:
        with db.session() as session:
            m = Measurement(uid="u1", config_index=0, config={"index": 0},
                            template="dense.x86", template_version=1,
                            workload_key="dense:M=32,N=32,K=32", target="llvm", state="queued")
            session.add(m)
            session.flush()
            ids = [m.id]
        ok = MeasureResult(costs=(1e-4,), error=ErrorKind.NONE)
        with pytest.raises(InvalidInputError), db.session() as session:
            store_result(session, ids[0], ok)
            raise InvalidInputError("abort after storing")  # rolled back: nothing counted
        assert metrics.results.labels(error="none")._value.get() == 0
        with db.session() as session:
            store_result(session, ids[0], ok)
        assert metrics.results.labels(error="none")._value.get() == 1
    finally:
        metrics.close()
        db.dispose()


def test_a_dead_database_reads_as_down_not_as_an_error(tmp_path: Path) -> None:
    db = Database("postgresql+psycopg://postgres@127.0.0.1:1/none?connect_timeout=2")
    metrics = ServiceMetrics(db, heartbeat_s=5.0)
    try:
        text = metrics.render().decode()
    finally:
        metrics.close()
        db.dispose()
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["tuner_database_up"] == 0
    assert "tuner_jobs" not in samples


def test_metrics_need_a_token_when_reads_do(migrated_url: str, tmp_path: Path) -> None:
    server = LiveServer(migrated_url, tmp_path / "data", read_requires_token=True,
                        run_driver=False)
    server.start()
    try:
        assert httpx.get(f"{server.url}/metrics", timeout=30).status_code == 401
        assert total(scrape(server, ADMIN_TOKEN), "tuner_database_up") == 1
    finally:
        server.stop()
