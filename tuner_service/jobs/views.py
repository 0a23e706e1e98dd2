"""Read models: job status, per-task history, best configs (JSON and AutoTVM lines).

Each read issues a fixed number of statements whatever the number of jobs or tasks: the job
list groups its tasks' progress in one query, best configs join their measurements.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from schedule_templates.records import ErrorKind
from schedule_templates.workloads import parse_workload
from tuner_service.db.models import Job, JobTask, Measurement, Task
from tuner_service.db.states import MeasurementState
from tuner_service.jobs.health import job_health
from tuner_service.jobs.results import measurement_result

AUTOTVM_LOG_VERSION = 0.2


def iso(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:  # SQLite hands back naive UTC
        value = value.replace(tzinfo=dt.UTC)
    return value.isoformat()


def epoch(value: dt.datetime | None) -> float:
    if value is None:
        return 0.0
    return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).timestamp()


def describe(key: str) -> str:
    """A workload key in words, or the key itself when it does not parse."""
    try:
        return parse_workload(key).describe()
    except Exception:  # a description is cosmetic; never fail a status read for it
        return key


def job_tasks(session: Session, job_id: int) -> list[tuple[JobTask, Task]]:
    rows = session.execute(
        select(JobTask, Task).join(Task, Task.id == JobTask.task_id)
        .where(JobTask.job_id == job_id).order_by(JobTask.id)
    ).all()
    return [(jt, task) for jt, task in rows]


def task_status(jt: JobTask, task: Task) -> dict[str, Any]:
    best = jt.best_cost
    return {
        "task_id": task.id, "workload": task.workload_key, "weight": task.weight,
        "flops": task.flops, "template": jt.template, "description": describe(task.workload_key),
        "trials_done": jt.trials_done, "trials_budget": jt.trials_budget,
        "best_gflops": task.flops / best / 1e9 if best else None,
        "best_latency_s": best, "status": jt.status, "message": jt.message,
    }


def job_summary(job: Job) -> dict[str, Any]:
    return {
        "job_id": job.id, "status": job.status, "message": job.message,
        "model_id": job.model_id, "target": job.target, "device_key": job.device_key,
        "tuner": job.tuner, "trials_per_task": job.trials_per_task,
        "created_at": iso(job.created_at), "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at),
    }


def job_status(session: Session, job: Job) -> dict[str, Any]:
    tasks = [task_status(jt, task) for jt, task in job_tasks(session, job.id)]
    return {**job_summary(job), "tasks": tasks, "health": job_health(session, job)}


def list_jobs(session: Session, limit: int = 100) -> list[dict[str, Any]]:
    """The newest jobs with their task count and progress: two statements in all."""
    jobs = session.scalars(select(Job).order_by(Job.id.desc()).limit(limit)).all()
    progress = {row.job_id: row for row in session.execute(
        select(JobTask.job_id, func.count().label("tasks"),
               func.coalesce(func.sum(JobTask.trials_done), 0).label("done"),
               func.coalesce(func.sum(JobTask.trials_budget), 0).label("budget"))
        .where(JobTask.job_id.in_([job.id for job in jobs]))
        .group_by(JobTask.job_id))} if jobs else {}
    out = []
    for job in jobs:
        row = progress.get(job.id)
        out.append({**job_summary(job), "tasks": int(row.tasks) if row else 0,
                    "trials_done": int(row.done) if row else 0,
                    "trials_budget": int(row.budget) if row else 0})
    return out


def history(session: Session, job_id: int, task_id: int, after: int = 0) -> list[dict[str, Any]]:
    """Every finished measurement of one task in order, numbered from 1 (``after`` skips)."""
    row = session.execute(select(JobTask.id, Task.flops).join(Task, Task.id == JobTask.task_id)
                          .where(JobTask.job_id == job_id, JobTask.task_id == task_id)).first()
    if row is None:
        return []
    done = session.scalars(
        select(Measurement).where(Measurement.job_task_id == row.id,
                                  Measurement.state == MeasurementState.DONE,
                                  Measurement.purpose != "confirm")  # re-measurements
        .order_by(Measurement.finished_at, Measurement.id)
    ).all()
    out = []
    for trial, m in enumerate(done, start=1):
        if trial <= after:
            continue
        ok = m.error_kind is ErrorKind.NONE and m.mean_cost
        out.append({
            "trial": trial, "measure_id": m.id, "config_index": m.config_index,
            "gflops": row.flops / m.mean_cost / 1e9 if ok and m.mean_cost else 0.0,
            "latency_s": m.mean_cost, "error_kind": m.error_kind,
            "error_message": m.error_message, "worker_id": m.worker_id,
            "spread": measurement_result(m).spread if ok else None, "noisy": bool(m.noisy),
            "timestamp": iso(m.finished_at),
        })
    return out


def _with_best(session: Session, job_id: int
               ) -> list[tuple[JobTask, Task, Measurement | None]]:
    """The job's tasks with their best measurements, in one joined query."""
    rows = session.execute(
        select(JobTask, Task, Measurement).join(Task, Task.id == JobTask.task_id)
        .outerjoin(Measurement, Measurement.id == JobTask.best_measurement_id)
        .where(JobTask.job_id == job_id).order_by(JobTask.id)
    ).all()
    return [(jt, task, m) for jt, task, m in rows]


def best_configs(session: Session, job: Job) -> list[dict[str, Any]]:
    out = []
    for jt, task, m in _with_best(session, job.id):
        out.append({
            **task_status(jt, task), "template_version": jt.template_version,
            "config": m.config if m else None, "measure_id": m.id if m else None,
        })
    return out


def autotvm_record(m: Measurement) -> dict[str, Any]:
    result = measurement_result(m)
    return {
        "input": [m.target, m.template, [m.workload_key], {}],
        "config": {"index": m.config_index, "code_hash": None,
                   "entity": (m.config or {}).get("entity", [])},
        "result": [list(result.costs), int(result.error),
                   result.compile_time_s + result.wall_time_s, epoch(m.finished_at)],
        "version": AUTOTVM_LOG_VERSION,
        "tvm_version": "0.x-compatible",
    }


def autotvm_lines(session: Session, job: Job) -> Iterator[str]:
    for _jt, _task, m in _with_best(session, job.id):
        if m is not None:
            yield json.dumps(autotvm_record(m)) + "\n"
