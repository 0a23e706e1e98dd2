"""Transfer records for ``xgb-transfer`` tasks, read from the shared database.

A task's prior is every finished measurement of the same template (same version) on the same
target, from any job or import, except the task's own measurements (those are replayed to its
tuner as its own data). Other workloads are the point; earlier jobs on the same workload count
too. The newest ``limit`` rows are read, columns only (no ORM objects), in one query.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from schedule_templates.records import ErrorKind, MeasureResult
from tuner_service.db.models import Measurement

#: rows read per task; the tuner keeps a sample of at most ``TransferParams.max_records``
DEFAULT_LIMIT = 6000


def transfer_records(session: Session, template: Any, target: str, exclude_job_task: int,
                     limit: int = DEFAULT_LIMIT) -> list[Any]:
    from tuner_service.tuners.transfer import TransferRecord

    rows = session.execute(
        select(Measurement.workload_key, Measurement.config_index, Measurement.costs,
               Measurement.error_kind)
        .where(Measurement.template == template.name,
               Measurement.template_version == int(template.version),
               Measurement.target == target, Measurement.state == "done",
               (Measurement.job_task_id.is_(None))
               | (Measurement.job_task_id != exclude_job_task))
        .order_by(Measurement.id.desc()).limit(limit)
    ).all()
    return [TransferRecord(key, template.name, int(index), _result(costs, error))
            for key, index, costs, error in rows]


def _result(costs: list[Any] | None, error: int | None) -> MeasureResult:
    if not error and costs:
        return MeasureResult(tuple(float(c) for c in costs))
    try:
        kind = ErrorKind(error or ErrorKind.UNKNOWN)
    except ValueError:
        kind = ErrorKind.UNKNOWN
    return MeasureResult.failure(kind, "")
