"""Storing one measurement result: idempotent, counted once, and folded into the shared log."""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

from sqlalchemy import and_, or_, select, true, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.records import ErrorKind, MeasureResult
from schedule_templates.workloads import parse_workload
from tuner_service.db.clock import utcnow
from tuner_service.db.errors import DatabaseError
from tuner_service.db.models import JobTask, Measurement, TuningLogEntry
from tuner_service.db.states import MEASUREMENT_PENDING, MeasurementState, ReportStatus
from tuner_service.jobs import device

logger = logging.getLogger(__name__)


#: ``session.info`` key listing the error kinds of results stored in the session's transaction
#: (read on commit by the metrics, so an aborted or retried transaction counts nothing)
STORED_RESULTS_INFO = "tuner.stored_results"


#: ``Measurement.purpose`` of a re-measurement of a job's top candidates (not a trial)
CONFIRM = "confirm"


@dataclasses.dataclass(frozen=True)
class Measured:
    """Where a result was measured, as the worker reported it."""

    device_class: str | None = None
    threads: int | None = None


@dataclasses.dataclass(frozen=True)
class Lease:
    """Who must hold a measurement's live lease for a worker's result to count."""

    worker_id: int
    device_key: str


def store_result(session: Session, measure_id: int, result: MeasureResult,
                 peak_gflops: float | None = None, worker_id: int | None = None,
                 lease: Lease | None = None, device: Measured | None = None) -> ReportStatus:
    """Mark a queued or leased measurement done; a second report of the same id is a duplicate.

    The guarded UPDATE (``state != 'done'``) makes concurrent double reports count once. With
    ``lease``, only that worker's unexpired lease on a measurement for its device key may be
    finished (database clock); anything else is ``NOT_LEASED_BY_YOU`` and changes nothing.
    ``device``: the class and threads the worker measured with. A job's results wait for
    its re-measurement (``jobs.confirm``) before they reach the shared log; others (imports)
    go there at once.
    """
    device = device or Measured()
    values: dict[str, Any] = {
        "state": MeasurementState.DONE,
        "costs": list(result.costs),
        "mean_cost": result.mean_cost if result.ok else None,
        "error_kind": int(result.error),
        "error_message": result.error_message,
        "compile_time_s": result.compile_time_s,
        "wall_time_s": result.wall_time_s,
        "peak_gflops": peak_gflops,
        "worker_id": worker_id,
        "finished_at": utcnow(),
        "lease_owner": None,
        "lease_expires_at": None,
        "device_class": device.device_class,
        "threads": device.threads,
        "noisy": result.noisy if result.ok else None,
        "load": result.load,
    }
    guard = [Measurement.id == measure_id, Measurement.state.in_(MEASUREMENT_PENDING)]
    if lease is not None:
        guard += [Measurement.state == MeasurementState.LEASED,
                  Measurement.lease_owner == lease.worker_id,
                  Measurement.lease_expires_at >= utcnow(),
                  or_(Measurement.device_key.is_(None),
                      Measurement.device_key == lease.device_key)]
    stmt = (
        update(Measurement)
        .where(*guard)
        .values(**values)
        .returning(Measurement.job_task_id, Measurement.purpose)
        .execution_options(synchronize_session=False)
    )
    row = session.execute(stmt).first()
    if row is None:
        found = session.execute(select(Measurement.state, Measurement.worker_id)
                                .where(Measurement.id == measure_id)).first()
        if found is None:
            return ReportStatus.UNKNOWN
        if lease is None or (found.state == MeasurementState.DONE
                             and found.worker_id == lease.worker_id):
            return ReportStatus.DUPLICATE  # finished before (by this worker, when one is named)
        return ReportStatus.NOT_LEASED_BY_YOU
    session.info.setdefault(STORED_RESULTS_INFO, []).append(int(result.error))
    if row.job_task_id is not None:
        if row.purpose != CONFIRM:
            _count_trial(session, row.job_task_id, measure_id, result)
    elif result.ok:
        measurement = session.get(Measurement, measure_id)
        assert measurement is not None
        update_tuning_log(session, measurement, job_id=None)
    return ReportStatus.ACCEPTED


def _count_trial(session: Session, job_task_id: int, measure_id: int,
                 result: MeasureResult) -> None:
    session.execute(
        update(JobTask)
        .where(JobTask.id == job_task_id)
        .values(trials_done=JobTask.trials_done + 1)
        .execution_options(synchronize_session=False)
    )
    if result.ok:
        session.execute(
            update(JobTask)
            .where(JobTask.id == job_task_id,
                   or_(JobTask.best_cost.is_(None), JobTask.best_cost > result.mean_cost))
            .values(best_cost=result.mean_cost, best_measurement_id=measure_id)
            .execution_options(synchronize_session=False)
        )


def update_tuning_log(session: Session, m: Measurement, job_id: int | None,
                      mean_cost: float | None = None, spread: float | None = None,
                      confirmed: bool = False, force: bool = False) -> None:
    """Make ``m`` the shared best for its (workload, target, device class, threads) if it
    beats the stored one (``mean_cost``/``spread``: the numbers of a re-measurement).

    A newer template version always replaces an older one (old numbers are incomparable);
    ``force``: the stored config was re-measured beside ``m`` and lost, so ``m`` replaces it.
    """
    cost = m.mean_cost if mean_cost is None else mean_cost
    if cost is None or not math.isfinite(cost) or cost <= 0:
        return
    try:
        workload = parse_workload(m.workload_key)
    except InvalidWorkloadError:
        logger.warning("measurement %s has an unparsable workload %r", m.id, m.workload_key)
        return
    if spread is None:
        spread = measurement_result(m).spread
    entry = {
        "workload_key": m.workload_key, "op": workload.op, "target": m.target,
        "template": m.template, "template_version": m.template_version, "config": m.config,
        "mean_cost": cost, "gflops": workload.flops() / cost / 1e9,
        "measurement_id": m.id, "job_id": job_id, "device_key": m.device_key,
        **device.class_columns(m.device_class), "threads": m.threads or 1,
        "spread": spread, "confirmed": confirmed,
    }
    upsert_entry(session, entry, force)


def upsert_entry(session: Session, entry: dict[str, Any], force: bool = False) -> None:
    """Store ``entry`` (tuning-log columns) unless the stored one is newer or faster."""
    dialect = session.get_bind().dialect.name
    insert_fn = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}.get(dialect)
    if insert_fn is None:
        raise DatabaseError(f"unsupported database dialect {dialect!r}")
    stmt: Any = insert_fn(TuningLogEntry).values(**entry)
    table = TuningLogEntry.__table__
    same_version = stmt.excluded.template_version == table.c.template_version
    better = or_(
        stmt.excluded.template_version > table.c.template_version,
        and_(same_version, true() if force else stmt.excluded.mean_cost < table.c.mean_cost),
    )
    keys = ("workload_key", "target", "device_class", "threads")
    changes: dict[str, Any] = {k: stmt.excluded[k] for k in entry if k not in keys}
    changes["updated_at"] = utcnow()
    session.execute(stmt.on_conflict_do_update(
        index_elements=list(keys), set_=changes, where=better,
    ))


def measurement_result(m: Measurement) -> MeasureResult:
    return MeasureResult.from_json({
        "costs": m.costs or [], "error_kind": m.error_kind or ErrorKind.NONE,
        "error_message": m.error_message, "compile_time_s": m.compile_time_s or 0.0,
        "wall_time_s": m.wall_time_s or 0.0, "noisy": bool(m.noisy), "load": m.load,
    })
