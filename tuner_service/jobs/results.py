"""Storing one measurement result: idempotent, counted once, and folded into the shared log."""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
from typing import Any

from sqlalchemy import and_, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.records import MeasureResult
from schedule_templates.workloads import parse_workload
from tuner_service.db.clock import utcnow
from tuner_service.db.errors import DatabaseError
from tuner_service.db.models import JobTask, Measurement, TuningLogEntry

logger = logging.getLogger(__name__)


#: ``session.info`` key listing the error kinds of results stored in the session's transaction
#: (read on commit by the metrics, so an aborted or retried transaction counts nothing)
STORED_RESULTS_INFO = "tuner.stored_results"


class Outcome(enum.Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    UNKNOWN = "unknown"
    #: the measurement exists but the reporting worker does not hold its lease (now)
    NOT_LEASED = "not_leased"


@dataclasses.dataclass(frozen=True)
class Lease:
    """Who must hold a measurement's live lease for a worker's result to count."""

    worker_id: int
    device_key: str


def store_result(session: Session, measure_id: int, result: MeasureResult,
                 peak_gflops: float | None = None, worker_id: int | None = None,
                 lease: Lease | None = None) -> Outcome:
    """Mark a queued or leased measurement done; a second report of the same id is a duplicate.

    The guarded UPDATE (``state != 'done'``) makes concurrent double reports count once. With
    ``lease``, only that worker's unexpired lease on a measurement for its device key may be
    finished (database clock); anything else is ``NOT_LEASED`` and changes nothing.
    """
    values: dict[str, Any] = {
        "state": "done",
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
    }
    guard = [Measurement.id == measure_id, Measurement.state.in_(("queued", "leased"))]
    if lease is not None:
        guard += [Measurement.state == "leased", Measurement.lease_owner == lease.worker_id,
                  Measurement.lease_expires_at >= utcnow(),
                  or_(Measurement.device_key.is_(None),
                      Measurement.device_key == lease.device_key)]
    stmt = (
        update(Measurement)
        .where(*guard)
        .values(**values)
        .returning(Measurement.job_task_id)
        .execution_options(synchronize_session=False)
    )
    row = session.execute(stmt).first()
    if row is None:
        found = session.execute(select(Measurement.state, Measurement.worker_id)
                                .where(Measurement.id == measure_id)).first()
        if found is None:
            return Outcome.UNKNOWN
        if lease is None or (found.state == "done" and found.worker_id == lease.worker_id):
            return Outcome.DUPLICATE  # finished before (by this worker, when one is named)
        return Outcome.NOT_LEASED
    session.info.setdefault(STORED_RESULTS_INFO, []).append(int(result.error))
    if row.job_task_id is not None:
        _count_trial(session, row.job_task_id, measure_id, result)
    if result.ok:
        measurement = session.get(Measurement, measure_id)
        assert measurement is not None
        update_tuning_log(session, measurement, job_id=_job_of(session, row.job_task_id))
    return Outcome.ACCEPTED


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


def _job_of(session: Session, job_task_id: int | None) -> int | None:
    if job_task_id is None:
        return None
    return session.scalar(select(JobTask.job_id).where(JobTask.id == job_task_id))


def update_tuning_log(session: Session, m: Measurement, job_id: int | None) -> None:
    """Make ``m`` the shared best for its (workload, target) if it beats the stored one.

    A newer template version always replaces an older one (old numbers are incomparable).
    """
    if m.mean_cost is None or not math.isfinite(m.mean_cost) or m.mean_cost <= 0:
        return
    try:
        workload = parse_workload(m.workload_key)
    except InvalidWorkloadError:
        logger.warning("measurement %s has an unparsable workload %r", m.id, m.workload_key)
        return
    entry = {
        "workload_key": m.workload_key, "op": workload.op, "target": m.target,
        "template": m.template, "template_version": m.template_version, "config": m.config,
        "mean_cost": m.mean_cost, "gflops": workload.flops() / m.mean_cost / 1e9,
        "measurement_id": m.id, "job_id": job_id, "device_key": m.device_key,
    }
    _upsert_best(session, entry)


def _upsert_best(session: Session, entry: dict[str, Any]) -> None:
    dialect = session.get_bind().dialect.name
    insert_fn = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}.get(dialect)
    if insert_fn is None:
        raise DatabaseError(f"unsupported database dialect {dialect!r}")
    stmt: Any = insert_fn(TuningLogEntry).values(**entry)
    table = TuningLogEntry.__table__
    better = or_(
        stmt.excluded.template_version > table.c.template_version,
        and_(stmt.excluded.template_version == table.c.template_version,
             stmt.excluded.mean_cost < table.c.mean_cost),
    )
    changes: dict[str, Any] = {k: stmt.excluded[k] for k in entry if k != "workload_key"}
    changes["updated_at"] = utcnow()
    session.execute(stmt.on_conflict_do_update(
        index_elements=["workload_key", "target"], set_=changes, where=better,
    ))


def measurement_result(m: Measurement) -> MeasureResult:
    return MeasureResult.from_json({
        "costs": m.costs or [], "error_kind": m.error_kind or 0,
        "error_message": m.error_message, "compile_time_s": m.compile_time_s or 0.0,
        "wall_time_s": m.wall_time_s or 0.0,
    })
