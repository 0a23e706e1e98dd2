"""The measurement queue on the database: compare-and-set claims, leases, idempotent results."""

from __future__ import annotations

import threading
import time

from sqlalchemy import select

from schedule_templates.records import MeasureResult
from tuner_service.db.engine import Database
from tuner_service.db.models import Measurement, Worker
from tuner_service.db.states import ReportStatus
from tuner_service.jobs import queue
from tuner_service.jobs.create import JobSpec, create_job
from tuner_service.jobs.driver import JobDriver
from tuner_service.jobs.results import store_result
from tuner_service.settings import Settings


def _queued_job(db: Database, settings: Settings, trials: int = 16) -> int:
    with db.session() as session:
        job = create_job(session, JobSpec(workloads=("dense:M=16,N=64,K=64",),
                                          trials_per_task=trials))
        job_id = job.id
    JobDriver(db, settings).step()
    return job_id


def _worker(db: Database) -> int:
    with db.session() as session:
        return queue.register_worker(session, {"device_key": "local", "target": "llvm"}, None).id


def _claim(db: Database, worker_id: int, n: int, lease_s: float = 30.0) -> list[int]:
    with db.session() as session:
        worker = session.get(Worker, worker_id)
        assert worker is not None
        ids = queue.claim(session, worker, n, lease_s)
    assert len(ids) <= n
    return ids


def test_concurrent_claimers_never_share_an_item(settings: Settings) -> None:
    settings = settings.with_overrides(queue_depth=40, batch_size=40)
    db = Database(settings.resolved_database_url)
    _queued_job(db, settings, trials=40)
    workers = [_worker(db) for _ in range(8)]
    got: dict[int, list[int]] = {w: [] for w in workers}

    def claimer(worker_id: int) -> None:
        for _ in range(10):
            got[worker_id].extend(_claim(db, worker_id, 2))

    threads = [threading.Thread(target=claimer, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    claimed = [i for ids in got.values() for i in ids]
    assert len(claimed) == len(set(claimed)) == 40
    db.dispose()


def test_expired_leases_return_and_poison_after_max_attempts(settings: Settings) -> None:
    settings = settings.with_overrides(max_attempts=2)
    db = Database(settings.resolved_database_url)
    _queued_job(db, settings, trials=4)
    worker_id = _worker(db)
    first = _claim(db, worker_id, 1, lease_s=0.05)
    time.sleep(0.2)
    with db.session() as session:
        assert queue.requeue_expired(session, settings.max_attempts) == (1, 0)
    assert _claim(db, worker_id, 1, lease_s=0.05) == first  # back in the queue, claimed again
    time.sleep(0.2)
    with db.session() as session:
        assert queue.requeue_expired(session, settings.max_attempts) == (0, 1)
        m = session.get(Measurement, first[0])
        assert m is not None and m.state == "done" and m.error_kind == 7
    db.dispose()


def test_results_are_idempotent_and_release_and_heartbeat(settings: Settings) -> None:
    db = Database(settings.resolved_database_url)
    _queued_job(db, settings, trials=4)
    worker_id = _worker(db)
    ids = _claim(db, worker_id, 3)
    result = MeasureResult(costs=(1e-3, 1e-3))
    with db.session() as session:
        assert store_result(session, ids[0], result) is ReportStatus.ACCEPTED
        assert store_result(session, ids[0], result) is ReportStatus.DUPLICATE
        assert store_result(session, 10**9, result) is ReportStatus.UNKNOWN
        extended, lost = queue.heartbeat(session, worker_id, ids, 30.0)
        assert extended == ids[1:] and lost == ids[:1]
        assert queue.release(session, worker_id, ids[1:]) == ids[1:]
        states = session.scalars(select(Measurement.state).where(Measurement.id.in_(ids)))
        assert sorted(states) == ["done", "queued", "queued"]
    db.dispose()


def test_a_worker_claims_the_jobs_its_target_serves(settings: Settings) -> None:
    """A job for ``llvm`` reaches a worker of ``llvm -mcpu=...`` (``Target.serves``), never one
    of another kind; claims come back as typed protocol items."""
    db = Database(settings.resolved_database_url)
    _queued_job(db, settings, trials=4)
    with db.session() as session:
        specific = queue.register_worker(
            session, {"device_key": "local", "target": "llvm  -mcpu=znver3"}, None)
        gpu = queue.register_worker(
            session, {"device_key": "local", "target": "cuda -arch=sm_90"}, None)
        assert specific.target == "llvm -mcpu=znver3"  # stored as parsed
        assert queue.live_workers(session, "llvm", "local", 60.0) == 1
        assert queue.live_workers(session, "llvm -mcpu=znver4", "local", 60.0) == 0
        assert queue.live_workers(session, "cuda", None, 60.0) == 1
        specific_id, gpu_id = specific.id, gpu.id
    assert _claim(db, gpu_id, 2) == []
    with db.session() as session:
        worker = session.get(Worker, specific_id)
        assert worker is not None
    items = queue.claim_batch(db, worker, 2, 30.0, {})
    assert len(items) == 2
    for item in items:
        assert str(item.target) == "llvm" and item.candidate.decode().workload.op == "dense"
