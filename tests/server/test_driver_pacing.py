"""The job driver under many workers: refits are paced, held results are never proposed again,
the queue is sized by how fast results arrive, and the job list reads in fixed statements."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import event

from schedule_templates.records import MeasureResult
from tuner_service.db.engine import Database
from tuner_service.db.models import Job
from tuner_service.jobs.create import JobSpec, create_job
from tuner_service.jobs.driver import Depth, JobDriver
from tuner_service.jobs.run import JobRun
from tuner_service.jobs.scheduler import make_scheduler
from tuner_service.settings import Settings

from .fakes import bearer

WORKLOADS = ("dense:M=8,N=16,K=32", "dense:M=16,N=16,K=16", "dense:M=16,N=32,K=16")


class SlowTell:
    """Wraps a tuner so each ``tell`` takes ``seconds`` (a refit)."""

    def __init__(self, tuner: Any, seconds: float) -> None:
        self.tuner, self.seconds, self.told = tuner, seconds, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tuner, name)

    def tell(self, indices: Sequence[int], results: Sequence[MeasureResult]) -> None:
        time.sleep(self.seconds)
        self.told += 1
        self.tuner.tell(indices, results)


def _run(settings: Settings) -> tuple[Database, JobRun]:
    db = Database(settings.resolved_database_url)
    with db.session() as session:
        job = create_job(session, JobSpec(workloads=WORKLOADS, trials_per_task=64,
                                          tuner="random"))
        run = JobRun.rebuild(session, job, make_scheduler("round-robin"))
    return db, run


def test_learning_stops_at_its_budget_and_the_rest_waits(settings: Settings) -> None:
    db, run = _run(settings)
    db.dispose()
    for task in run.tasks:
        task.tuner = SlowTell(task.tuner, 0.05)  # type: ignore[assignment]
    ok = MeasureResult.from_json({"costs": [1e-3], "error_kind": 0})
    observed = [(task, [position], [ok]) for position, task in enumerate(run.tasks)]
    assert run.learn(observed, budget_s=0.01) == 1  # at least one task, then the budget ends
    held = [t for t in run.tasks if t.untold_since is not None]
    assert len(held) == 2
    for task in held:  # held configs are taken, and count in the task's curve already
        assert task.untold[0][0] in task.tuner.visited and task.curve == [1e-3]
    assert run.learn([], budget_s=10.0) == 2
    assert all(t.untold_since is None and t.tuner.told == 1 for t in run.tasks)


def test_the_queue_follows_the_rate_results_arrive_at(settings: Settings) -> None:
    settings = settings.with_overrides(queue_ahead_s=2.0, queue_per_worker=0)
    db, run = _run(settings)
    run.finish_rate = 50.0  # results per second
    assert Depth(settings.queue_depth, 0, 0).starving is False
    with db.session() as session:
        job = session.get(Job, run.job_id)
        assert job is not None
        depth = JobDriver(db, settings)._queue_depth(session, job, run)
    db.dispose()
    assert depth == Depth(target=100, demand=100, queued=0) and depth.starving
    proposals = run.propose(depth.target, settings.batch_size, depth.demand)
    # each task may hold its share of the demand, not only a batch
    assert sum(len(indices) for _task, indices in proposals) == 100


def test_the_job_list_reads_in_two_statements(
        make_client: Callable[[Settings], TestClient], tokens: dict[str, str],
        settings: Settings) -> None:
    client = make_client(settings.with_overrides(run_driver=False))  # its reads only
    for _ in range(3):
        answer = client.post("/api/v1/jobs", headers=bearer(tokens["user"]), json={
            "workloads": list(WORKLOADS), "trials_per_task": 4})
        assert answer.status_code == 201, answer.text
    db = client.app.state.db  # type: ignore[attr-defined]
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append(statement)

    engine = db._read_engine or db.engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        jobs = client.get("/api/v1/jobs").json()
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert len(jobs) == 3 and all(j["tasks"] == 3 and j["trials_budget"] == 12 for j in jobs)
    assert len(seen) == 2, seen


def test_the_queue_holds_what_the_live_workers_claim(settings: Settings) -> None:
    """What the live workers last asked for sizes their jobs' queues at once (many workers
    arriving together would otherwise find them empty until the rate of results catches up)."""
    from tuner_service.jobs import queue

    settings = settings.with_overrides(queue_per_worker=2, queue_ahead_s=2.0)
    db, run = _run(settings)
    driver = JobDriver(db, settings)
    with db.session() as session:
        workers = [queue.register_worker(session, {"device_key": "local", "target": "llvm"},
                                         None).id for _ in range(3)]
    driver.note_claim(workers[0], 16, 3)
    driver.note_claim(workers[0], 40, 0)  # the latest claim counts
    driver.note_claim(workers[1], 16, 16)
    with db.session() as session:
        job = session.get(Job, run.job_id)
        assert job is not None
        assert driver._queue_depth(session, job, run) == Depth(56, 56, 0)
        driver.note_claim(workers[0], 1, 1)
        driver.note_claim(workers[1], 1, 1)  # queue_per_worker x 3 live workers is more
        assert driver._queue_depth(session, job, run) == Depth(8, 6, 0)  # at least queue_depth
        run.finish_rate = 50.0  # 100 results in queue_ahead_s: more than the claims
        assert driver._queue_depth(session, job, run).demand == 100
    db.dispose()
