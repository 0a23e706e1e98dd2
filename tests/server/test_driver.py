"""The job driver: resume after a restart, and one driver per job across server processes."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient
from sqlalchemy import select

from tuner_service.db.engine import Database
from tuner_service.db.models import Job, Measurement
from tuner_service.jobs.create import JobSpec, create_job
from tuner_service.jobs.driver import JobDriver
from tuner_service.settings import Settings

from .fakes import FakeWorker, bearer


def test_a_restarted_server_resumes_the_job(settings: Settings, tokens: dict[str, str],
                                            make_client: Callable[[Settings], TestClient]
                                            ) -> None:
    first = make_client(settings)
    answer = first.post("/api/v1/jobs", headers=bearer(tokens["user"]), json={
        "workloads": ["dense:M=8,N=16,K=32"], "trials_per_task": 12})
    job_id = answer.json()["job_id"]
    worker = FakeWorker(first, tokens["worker"])
    worker.report(worker.claim(4, wait_s=2.0))
    first.__exit__(None, None, None)  # server stops mid-job (its driver lease is released)

    second = make_client(settings)
    status = FakeWorker(second, tokens["worker"]).run_until_done(job_id)
    assert status["status"] == "done" and status["tasks"][0]["trials_done"] == 12
    db = Database(settings.resolved_database_url)
    with db.session() as session:
        indices = session.scalars(select(Measurement.config_index)
                                  .where(Measurement.purpose == "tune")).all()
    db.dispose()
    assert len(indices) == len(set(indices)) == 12  # the rebuilt tuner never repeats a config


def test_two_drivers_never_drive_the_same_job(settings: Settings) -> None:
    db = Database(settings.resolved_database_url)
    with db.session() as session:
        job_id = create_job(session, JobSpec(workloads=("dense:M=8,N=16,K=32",),
                                             trials_per_task=8)).id
    a, b = JobDriver(db, settings, owner="a"), JobDriver(db, settings, owner="b")
    a.step()
    b.step()
    with db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.driver_owner == "a" and job.status == "running"
        queued = session.scalars(select(Measurement.id)).all()
    assert len(queued) == settings.batch_size  # b added nothing
    a.stop()  # releases the lease: b takes over at once
    b.step()
    with db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.driver_owner == "b"
    b.stop()
    db.dispose()
