"""Claims on PostgreSQL (``queue.claim_batch``): one statement per attempt, and never an empty
answer while work is queued only because other claims still hold its rows."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import select

from tuner_service.db.engine import Database
from tuner_service.db.models import Measurement, Worker
from tuner_service.db.states import MeasurementState
from tuner_service.jobs import queue
from tuner_service.jobs.create import JobSpec, create_job
from tuner_service.jobs.driver import JobDriver
from tuner_service.settings import Settings

pytestmark = pytest.mark.postgres

HOLD_S = 0.5


@pytest.fixture
def postgres_settings(settings: Settings) -> Settings:
    if not settings.resolved_database_url.startswith("postgresql"):
        pytest.skip("row locks and SKIP LOCKED: PostgreSQL only (SQLite serializes writers)")
    return settings.with_overrides(queue_depth=4, batch_size=4)


def _queued(db: Database, settings: Settings) -> Worker:
    with db.session() as session:
        create_job(session, JobSpec(workloads=("dense:M=16,N=64,K=64",), trials_per_task=4))
    JobDriver(db, settings).step()
    with db.session() as session:
        return queue.register_worker(session, {"device_key": "local", "target": "llvm"}, None)


def test_a_claim_waits_for_rows_other_claims_hold_instead_of_answering_empty(
        postgres_settings: Settings) -> None:
    db = Database(postgres_settings.resolved_database_url)
    try:
        worker = _queued(db, postgres_settings)
        held = threading.Event()

        def other_claim() -> None:
            """Locks every queued row, as a claim does before it commits, then lets go."""
            with db.session() as session:
                ids = session.scalars(select(Measurement.id).where(
                    Measurement.state == MeasurementState.QUEUED).with_for_update()).all()
                assert len(ids) == 4
                held.set()
                time.sleep(HOLD_S)
                session.rollback()  # the other claim failed: its rows are queued again

        holder = threading.Thread(target=other_claim)
        holder.start()
        assert held.wait(30)
        start = time.monotonic()
        items = queue.claim_batch(db, worker, 2, 30.0, {})
        waited = time.monotonic() - start
        holder.join()
        assert len(items) == 2  # not an empty answer while 4 were queued
        assert waited >= HOLD_S * 0.5  # it waited for the lock holder
    finally:
        db.dispose()


def test_an_empty_queue_is_answered_at_once(postgres_settings: Settings) -> None:
    db = Database(postgres_settings.resolved_database_url)
    try:
        worker = _queued(db, postgres_settings)
        assert len(queue.claim_batch(db, worker, 10, 30.0, {})) == 4
        start = time.monotonic()
        assert queue.claim_batch(db, worker, 10, 30.0, {}) == []
        assert time.monotonic() - start < 5
        with db.read_session() as session:
            seen = session.get(Worker, worker.id)
            assert seen is not None and seen.last_heartbeat is not None  # the claim touched it
    finally:
        db.dispose()
