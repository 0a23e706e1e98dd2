"""Read queries behind the dashboard.

Each function issues a fixed number of statements, whatever the number of jobs, tasks or
measurements: aggregates and joins, never one lookup per row.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session

from tuner_service.compiler.frontend.layout_plans import plan_indices
from tuner_service.db.clock import utcnow, utcnow_plus
from tuner_service.db.models import Job, JobTask, Measurement, Model, Task, TuningLogEntry
from tuner_service.db.states import MEASUREMENT_PENDING, MeasurementState, TaskStatus
from tuner_service.jobs import log
from tuner_service.jobs.health import job_health
from tuner_service.jobs.results import CONFIRM
from tuner_service.jobs.timings import timing_medians
from tuner_service.jobs.views import describe, iso, job_summary

#: the columns of one point, in the order each point's list holds them
POINT_FIELDS = ("id", "task_id", "latency_s", "error_kind", "finished_at", "config_index")
MAX_POINTS = 20_000  # per answer; the client asks again from the cursor it gets back
ERROR_TEXT = 300  # characters of an error message sent with a point
#: workers' throughput is counted over the last RATE_WINDOW_S, error rates over ERROR_WINDOW_S
RATE_WINDOW_S = 300.0
ERROR_WINDOW_S = 3600.0


def server_time(session: Session) -> str | None:
    """The database clock, so browsers show "seconds ago" right whatever their own clock says."""
    now = session.scalar(select(utcnow()))
    if isinstance(now, str):  # SQLite returns the text of an expression
        now = dt.datetime.fromisoformat(now)
    return iso(now)


def jobs_overview(session: Session, limit: int) -> list[dict[str, Any]]:
    """The newest jobs with their model name, progress and current end-to-end estimate."""
    recent = select(Job.id).order_by(Job.id.desc()).limit(limit).scalar_subquery()
    tunable = JobTask.status != TaskStatus.SKIPPED
    progress = (
        select(
            JobTask.job_id,
            func.count().label("tasks"),
            func.coalesce(func.sum(JobTask.trials_done), 0).label("done"),
            func.coalesce(func.sum(JobTask.trials_budget), 0).label("budget"),
            func.sum(case((tunable & JobTask.best_cost.is_(None), 1), else_=0)).label("unbest"),
        )
        .join(Task, Task.id == JobTask.task_id)
        .where(JobTask.job_id.in_(recent))
        .group_by(JobTask.job_id)
        .subquery()
    )
    rows = session.execute(
        select(Job, Model.name, progress.c.tasks, progress.c.done, progress.c.budget,
               progress.c.unbest)
        .outerjoin(Model, Model.id == Job.model_id)
        .outerjoin(progress, progress.c.job_id == Job.id)
        .order_by(Job.id.desc()).limit(limit)
    ).all()
    # one more query for every listed job's tunable tasks: a job tuned for both layouts holds
    # each conv twice (plain and blocked twin), and its estimate counts each layer once
    costs: dict[int, list[tuple[str, float]]] = {}
    for job_id, key, weight, best in session.execute(
            select(JobTask.job_id, Task.workload_key, Task.weight, JobTask.best_cost)
            .join(Task, Task.id == JobTask.task_id)
            .where(JobTask.job_id.in_(recent), tunable).order_by(JobTask.id)):
        costs.setdefault(job_id, []).append((key, float(weight) * float(best or 0.0)))
    return [{
        **job_summary(job), "model_name": name or None, "tasks": tasks or 0,
        "trials_done": int(done or 0), "trials_budget": int(budget or 0),
        "estimated_latency_s": _estimate(costs.get(job.id, [])) if tasks and not unbest
        else None,
    } for job, name, tasks, done, budget, unbest in rows]


def _estimate(tasks: list[tuple[str, float]]) -> float | None:
    """Weight x best latency summed over one library plan's tasks, the faster plan where the
    job holds both layouts' (``layout_plans``); None for nothing to sum."""
    if not tasks:
        return None
    keys = [key for key, _ in tasks]
    total = min(sum(tasks[i][1] for i in plan) for plan in plan_indices(keys))
    return total or None


def job_tasks(session: Session, job: Job) -> list[dict[str, Any]]:
    """Every task of the job with its best result and the device peak reported with it."""
    rows = session.execute(
        select(JobTask, Task, Measurement.peak_gflops, Measurement.config_index,
               Measurement.config, Measurement.costs, Measurement.noisy)
        .join(Task, Task.id == JobTask.task_id)
        .outerjoin(Measurement, Measurement.id == JobTask.best_measurement_id)
        .where(JobTask.job_id == job.id)
        .order_by(JobTask.id)
    ).all()
    out = []
    for jt, task, peak, best_index, best_config, costs, noisy in rows:
        best = jt.best_cost
        gflops = task.flops / best / 1e9 if best else None
        out.append({
            "task_id": task.id, "workload": task.workload_key, "op": task.op,
            "description": describe(task.workload_key), "weight": task.weight,
            "flops": task.flops, "template": jt.template, "trials_done": jt.trials_done,
            "trials_budget": jt.trials_budget, "best_latency_s": best, "best_gflops": gflops,
            "best_config_index": best_index, "peak_gflops": peak,
            "best_algorithm": _algorithm(best_config),
            "fraction_of_peak": gflops / peak if gflops and peak else None,
            "best_spread": _spread(costs), "best_noisy": bool(noisy),
            "status": jt.status, "message": jt.message,
        })
    return out


def _spread(costs: Any) -> float | None:
    """(slowest - fastest) / fastest sample of a result (None without two samples)."""
    values = [float(c) for c in costs if isinstance(c, int | float)] \
        if isinstance(costs, list) else []
    if len(values) < 2 or min(values) <= 0:
        return None
    return (max(values) - min(values)) / min(values)


def _algorithm(config: Any) -> str | None:
    """The ``algorithm`` knob of a config (``winograd4``...), None where it has none: effective
    GFLOPS of a fast algorithm count the direct FLOPs and may exceed the device peak."""
    entities = config.get("entity") if isinstance(config, dict) else None
    for entity in entities if isinstance(entities, list) else []:
        if isinstance(entity, list) and len(entity) == 3 and entity[0] == "algorithm":
            return str(entity[2])
    return None


def job_points(session: Session, job_id: int, since_id: int
               ) -> tuple[list[list[Any]], dict[str, str], int, bool]:
    """Finished measurements of the job with an id above ``since_id``, in id order.

    Returns (points, error messages by id, cursor, more). Every finished measurement with an id
    at or below the cursor has now been sent, so the client asks again with ``since_id=cursor``
    and drops the ids it already holds (measurements in flight finish out of id order).
    """
    # re-measurements of the top candidates (``jobs.confirm``) are not trials
    in_job = and_(JobTask.job_id == job_id, Measurement.purpose != CONFIRM)
    # The lowest id still in flight, read BEFORE the points: one that finishes in between
    # then stays above the cursor and is sent next time.
    pending_min = session.scalar(
        select(func.min(Measurement.id)).join(JobTask, JobTask.id == Measurement.job_task_id)
        .where(in_job, Measurement.state.in_(MEASUREMENT_PENDING), Measurement.id > since_id))
    rows = session.execute(
        select(Measurement.id, JobTask.task_id, Measurement.mean_cost, Measurement.error_kind,
               Measurement.finished_at, Measurement.config_index,
               func.substr(Measurement.error_message, 1, ERROR_TEXT))
        .join(JobTask, JobTask.id == Measurement.job_task_id)
        .where(in_job, Measurement.state == MeasurementState.DONE, Measurement.id > since_id)
        .order_by(Measurement.id)
        .limit(MAX_POINTS + 1)
    ).all()
    more = len(rows) > MAX_POINTS
    rows = rows[:MAX_POINTS]
    points, errors = [], {}
    for mid, task_id, cost, kind, finished, index, message in rows:
        points.append([mid, task_id, cost, kind, iso(finished), index])
        if kind and message:
            errors[str(mid)] = message
    cursor = rows[-1][0] if rows else since_id
    if pending_min is not None:
        cursor = min(cursor, pending_min - 1) if more else max(since_id, pending_min - 1)
    return points, errors, max(cursor, since_id), more


def job_snapshot(session: Session, job: Job, since_id: int) -> dict[str, Any]:
    model_name = session.scalar(select(Model.name).where(Model.id == job.model_id)) \
        if job.model_id else None
    tasks = job_tasks(session, job)
    points, errors, cursor, more = job_points(session, job.id, since_id)
    return {
        **job_summary(job), "model_name": model_name or None, "tuner": job.tuner,
        "server_time": server_time(session), "tasks": tasks, "point_fields": list(POINT_FIELDS),
        "points": points, "errors": errors, "cursor": cursor, "more": more,
        "health": job_health(session, job),
    }


def worker_stats(session: Session, heartbeat_s: float) -> list[dict[str, Any]]:
    """Each worker with its throughput, error mix and time split over recent windows."""
    workers = log.workers(session, heartbeat_s)
    recent = Measurement.finished_at >= utcnow_plus(-RATE_WINDOW_S)
    rows = session.execute(
        select(Measurement.worker_id, Measurement.error_kind, func.count(),
               func.sum(case((recent, 1), else_=0)))
        .where(Measurement.worker_id.is_not(None), Measurement.state == MeasurementState.DONE,
               Measurement.finished_at >= utcnow_plus(-ERROR_WINDOW_S))
        .group_by(Measurement.worker_id, Measurement.error_kind)
    ).all()
    by_worker: dict[int, dict[str, Any]] = {}
    for worker_id, kind, count, recent_count in rows:
        stats = by_worker.setdefault(worker_id, {"measured": 0, "recent": 0, "errors": {}})
        stats["measured"] += count
        stats["recent"] += int(recent_count or 0)
        if kind:
            stats["errors"][str(kind)] = stats["errors"].get(str(kind), 0) + count
    medians = timing_medians(session, RATE_WINDOW_S)
    for w in workers:
        stats = by_worker.get(w["worker_id"], {"measured": 0, "recent": 0, "errors": {}})
        w["candidates_per_min"] = stats["recent"] / (RATE_WINDOW_S / 60.0)
        w["measured_last_hour"] = stats["measured"]
        w["errors_last_hour"] = stats["errors"]
        w["timing_medians_s"] = medians.get(w["worker_id"], {})
    return workers


def tuning_log(session: Session, op: str | None, target: str | None, workload: str | None,
               limit: int) -> dict[str, Any]:
    """The shared log's entries (the REST query) with descriptions and the filter choices."""
    entries = log.entries(session, op, target, workload, limit)
    for entry in entries:
        entry["description"] = describe(entry["workload"])
    ops = session.scalars(select(TuningLogEntry.op).distinct().order_by(TuningLogEntry.op)).all()
    targets = session.scalars(
        select(TuningLogEntry.target).distinct().order_by(TuningLogEntry.target)).all()
    return {"entries": entries, "ops": list(ops), "targets": list(targets),
            "server_time": server_time(session)}
