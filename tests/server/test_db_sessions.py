"""The database edge: read sessions never wait for SQLite's write lock, a write that cannot get
it in time fails as ``DatabaseBusyError`` (503 with Retry-After), values the database refuses
are 422, and timestamps come back time-zone-aware UTC on both databases."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, text

from tuner_service.db.engine import Database
from tuner_service.db.errors import DatabaseBusyError
from tuner_service.db.migrate import upgrade
from tuner_service.db.models import Job, Worker
from tuner_service.db.types import bounded_utc
from tuner_service.errors import InvalidInputError
from tuner_service.settings import Settings


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Database:
    url = f"sqlite:///{tmp_path / 'busy.db'}"
    upgrade(url)
    return Database(url, busy_timeout_s=0.3)


def _hold_write_lock(db: Database, release: threading.Event, held: threading.Event) -> None:
    with db.session() as session:
        session.execute(text("UPDATE jobs SET message = 'x' WHERE 0"))
        held.set()
        release.wait(10)


def test_reads_pass_a_held_write_lock_and_writes_time_out_busy(sqlite_db: Database) -> None:
    release, held = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(sqlite_db, release, held))
    holder.start()
    try:
        assert held.wait(10)
        with sqlite_db.read_session() as session:  # no wait: WAL readers pass the writer
            assert session.scalar(select(Job.id)) is None
        with pytest.raises(DatabaseBusyError), sqlite_db.session() as session:
            session.execute(text("UPDATE jobs SET message = 'y' WHERE 0"))
    finally:
        release.set()
        holder.join(10)
        sqlite_db.dispose()


def test_a_busy_database_answers_503_with_retry_after(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'api.db'}"
    upgrade(url)
    settings = Settings(database_url=url, data_dir=tmp_path, run_driver=False,
                        database_busy_timeout_s=0.3)
    from tuner_service import auth
    from tuner_service.app import create_app

    with TestClient(create_app(settings)) as client:
        db: Database = client.app.state.db  # type: ignore[attr-defined]
        with db.session() as session:
            secret = auth.create_token(session, "user", "busy")[1]
        release, held = threading.Event(), threading.Event()
        holder = threading.Thread(target=_hold_write_lock, args=(db, release, held))
        holder.start()
        try:
            assert held.wait(10)
            assert client.get("/api/v1/jobs").status_code == 200  # reads still answer
            answer = client.post("/api/v1/jobs", headers={"Authorization": f"Bearer {secret}"},
                                 json={"workloads": ["dense:M=8,N=16,K=32"]})
            assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
        finally:
            release.set()
            holder.join(10)


def test_timestamps_are_utc_aware_on_both_databases(migrated_url: str) -> None:
    db = Database(migrated_url)
    try:
        eastern = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=14)))
        with db.session() as session:
            job = Job(target="llvm", trials_per_task=1, tuner="random", options={},
                      status="queued", message="", started_at=eastern,
                      finished_at=dt.datetime(2026, 3, 1, 0, 0))  # naive means UTC
            session.add(job)
            session.flush()
            job_id = job.id
        with db.read_session() as session:
            stored = session.get(Job, job_id)
            assert stored is not None
            assert stored.started_at == eastern
            assert stored.started_at.utcoffset() == dt.timedelta(0)
            assert stored.finished_at == dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
            assert stored.created_at.tzinfo is not None
            later = session.scalar(select(Job.id).where(
                Job.started_at >= dt.datetime(2026, 2, 28, 21, 0, tzinfo=dt.UTC)))
            assert later == job_id  # compared in UTC: 12:00+14:00 is 22:00 the day before
            assert session.scalar(select(Job.id).where(
                Job.started_at >= dt.datetime(2026, 2, 28, 23, 0, tzinfo=dt.UTC))) is None
    finally:
        db.dispose()


def test_a_value_the_database_refuses_is_invalid_input_not_unavailable(
        migrated_url: str) -> None:
    db = Database(migrated_url)
    try:
        with pytest.raises(InvalidInputError, match="stored"), db.session() as session:
            session.add(Worker(name="x", device_key="k", target="llvm",
                               hardware={"v": float("nan")}, software={}))
            session.flush()
    finally:
        db.dispose()


@pytest.mark.parametrize("value", [
    dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=14))),
    dt.datetime(9999, 12, 31, 23, 59, tzinfo=dt.timezone(dt.timedelta(hours=-14))),
    dt.datetime(1969, 12, 31, 23, 59, tzinfo=dt.UTC),
    dt.datetime(9000, 1, 1, tzinfo=dt.UTC),
])
def test_timestamps_out_of_range_are_refused(value: dt.datetime) -> None:
    with pytest.raises(ValueError, match="out of range"):
        bounded_utc(value)


def test_a_pooled_connection_the_database_dropped_is_replaced(
        migrated_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL: a connection idle in the pool is pinged before use and replaced when the
    server closed it (as after a restart), so the next transaction works."""
    if not migrated_url.startswith("postgresql"):
        pytest.skip("pinging pooled connections is PostgreSQL's")
    from tuner_service.db import engine

    monkeypatch.setattr(engine, "PING_IDLE_S", 0.0)  # every pooled connection counts as idle
    db = Database(migrated_url)
    try:
        with db.session() as session:
            pid = session.scalar(text("SELECT pg_backend_pid()"))
        with Database(migrated_url).session() as other:  # the database drops that connection
            assert other.scalar(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        with db.session() as session:
            assert session.scalar(text("SELECT pg_backend_pid()")) != pid
    finally:
        db.dispose()
