"""Batched reports: one transaction with a fixed number of statements, a status per result,
the worker's time split stored with each result and shown per worker."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import event, select, text

from schedule_templates.protocol import Report
from schedule_templates.records import MeasureResult
from tuner_service.db.engine import Database
from tuner_service.db.models import JobTask, Measurement
from tuner_service.jobs import queue
from tuner_service.jobs.create import JobSpec, create_job
from tuner_service.jobs.driver import JobDriver
from tuner_service.settings import Settings

from .fakes import FakeWorker, bearer


def _result(index: int, cost: float = 1e-3) -> MeasureResult:
    return MeasureResult.from_json({"costs": [cost * (1 + index % 5)], "error_kind": 0})


@contextmanager
def _statements(db: Database) -> Iterator[list[str]]:
    """Every statement sent to the database meanwhile (an executemany counts once)."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(db.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(db.engine, "before_cursor_execute", record)


def _claimed(db: Database, settings: Settings, trials: int, claim: int) -> tuple[int, list[int]]:
    with db.session() as session:
        create_job(session, JobSpec(workloads=("dense:M=16,N=64,K=64",), trials_per_task=trials))
    JobDriver(db, settings).step()
    with db.session() as session:
        worker = queue.register_worker(session, {"device_key": "local", "target": "llvm"}, None)
        ids = queue.claim(session, worker, claim, 30.0)
    return worker.id, ids


def test_a_report_costs_the_same_statements_whatever_its_size(settings: Settings) -> None:
    settings = settings.with_overrides(queue_depth=64, batch_size=64)
    db = Database(settings.resolved_database_url)
    worker_id, ids = _claimed(db, settings, trials=64, claim=40)
    counts = []
    for batch in (ids[:2], ids[2:40]):
        with db.session() as session, _statements(db) as seen:
            worker = session.get(queue.Worker, worker_id)
            assert worker is not None
            answer = queue.report_results(session, worker,
                                          [Report(i, _result(i)) for i in batch])
        assert answer["accepted"] == batch
        counts.append(len(seen))
    # the worker read, its heartbeat, the row lock, the update, 2 task updates (and SQLite's
    # BEGIN); none for results outside any job when there are none
    assert counts[0] == counts[1] <= 7, counts
    with db.session() as session:
        done = session.scalar(select(JobTask.trials_done))
        best = session.execute(select(JobTask.best_cost, JobTask.best_measurement_id)).one()
        costs = dict(session.execute(select(Measurement.id, Measurement.mean_cost)
                                     .where(Measurement.state == "done")).all())
    db.dispose()
    assert done == 40
    assert best.best_cost == min(costs.values()) and costs[best.best_measurement_id] == best[0]


def test_one_batch_gets_a_status_per_result(settings: Settings) -> None:
    settings = settings.with_overrides(batch_size=8)
    db = Database(settings.resolved_database_url)
    worker_id, ids = _claimed(db, settings, trials=8, claim=4)
    with db.session() as session:
        other = queue.register_worker(session, {"device_key": "local", "target": "llvm"}, None)
        theirs = queue.claim(session, other, 1, 30.0)
        # the lease of ids[1] lapsed; ids[0] was finished before by this worker
        session.execute(text("UPDATE measurements SET lease_expires_at = :t WHERE id = :i"),
                        {"t": "2000-01-01 00:00:00", "i": ids[1]})
    with db.session() as session:
        worker = session.get(queue.Worker, worker_id)
        assert worker is not None
        queue.report_results(session, worker, [Report(ids[0], _result(0))])
        answer = queue.report_results(session, worker, [
            Report(ids[0], _result(0)), Report(ids[1], _result(1)),
            Report(ids[2], _result(2)), Report(ids[2], _result(2)),
            Report(ids[3], MeasureResult.from_json({"costs": [], "error_kind": 0})),
            Report(theirs[0], _result(3)), Report(10**9, _result(4))])
    db.dispose()
    statuses = [(s["measure_id"], s["status"]) for s in answer["statuses"]]
    assert statuses == [(ids[0], "duplicate"), (ids[1], "expired"), (ids[2], "accepted"),
                        (ids[2], "duplicate"), (ids[3], "rejected"),
                        (theirs[0], "not_leased_by_you"), (10**9, "unknown")]
    assert answer["accepted"] == [ids[2]]
    assert {r["measure_id"] for r in answer["rejected"]} == {ids[1], ids[3], theirs[0], 10**9}


def test_timings_are_stored_and_shown_as_medians_per_worker(
        client: TestClient, tokens: dict[str, str]) -> None:
    answer = client.post("/api/v1/jobs", headers=bearer(tokens["user"]), json={
        "workloads": ["dense:M=8,N=16,K=32"], "trials_per_task": 8})
    assert answer.status_code == 201, answer.text
    worker = FakeWorker(client, tokens["worker"])
    items = worker.claim(4, wait_s=2.0)
    assert len(items) == 4
    parts = [{"build_s": 0.1, "measure_s": 0.2, "unknown_part": 3},
             {"build_s": 0.3, "measure_s": 0.2, "wait_s": 0.5},
             {"build_s": 9.0, "check_s": -1.0},  # negative: the split is dropped
             {"build_s": 9.0, "report_s": 1e300}]  # beyond a day: dropped too
    results = [{"measure_id": i["measure_id"], "costs": [1e-3], "error_kind": 0,
                "timings": timing} for i, timing in zip(items, parts, strict=True)]
    answer = client.post(worker.url("results"), headers=worker.headers,
                         json={"results": results})
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["accepted"]) == 4  # a bad time split never costs the result
    row = next(w for w in client.get("/api/v1/dashboard/workers").json()["workers"]
               if w["worker_id"] == worker.worker_id)
    assert row["timing_medians_s"] == {"build_s": 0.2, "measure_s": 0.2, "wait_s": 0.5}
    metrics = client.get("/metrics").text
    assert (f'tuner_worker_time_per_candidate_seconds{{part="build",'
            f'worker_id="{worker.worker_id}"}} 0.2') in metrics


def test_a_claim_costs_the_same_statements_whatever_its_size(settings: Settings) -> None:
    settings = settings.with_overrides(queue_depth=64, batch_size=64)
    db = Database(settings.resolved_database_url)
    worker_id, _ids = _claimed(db, settings, trials=64, claim=0)
    with db.session() as session:
        worker = session.get(queue.Worker, worker_id)
    assert worker is not None
    counts, sizes = [], []
    for size in (2, 40):
        with _statements(db) as seen:
            items = queue.claim_batch(db, worker, size, 30.0, {})
        counts.append(len(seen))
        sizes.append(len(items))
    db.dispose()
    assert sizes == [2, 40]
    assert counts[0] == counts[1] <= 5, counts  # heartbeat, claim, read items (+ begin/commit)
