"""Transfer records for ``xgb-transfer`` tasks, read from the shared database.

A task's prior is every finished measurement of the same template (same version) on the same
target, from any job or import, except the task's own measurements (those are replayed to its
tuner as its own data). Other workloads are the point; earlier jobs on the same workload count
too. The newest ``limit`` rows are read, columns only (no ORM objects), in one query.

Measurements from other hardware rank configs differently, so when the task's device class is
known, the prior keeps the closest level that has enough records: the same class, else the same
microarchitecture, else the same ISA level, else every record (``jobs.device``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from schedule_templates.records import ErrorKind, MeasureResult
from tuner_service.db.models import Measurement
from tuner_service.db.states import MeasurementState
from tuner_service.jobs.device import LEVELS, class_level
from workers.device_class import DeviceClass

#: rows read per task; the tuner keeps a sample of at most ``TransferParams.max_records``
DEFAULT_LIMIT = 6000
#: a device level is used for the prior once it holds this many records
MIN_LEVEL_RECORDS = 32


def transfer_records(session: Session, template: Any, target: str, exclude_job_task: int,
                     limit: int = DEFAULT_LIMIT, device_class: str | None = None) -> list[Any]:
    from tuner_service.tuners.transfer import TransferRecord

    rows = session.execute(
        select(Measurement.workload_key, Measurement.config_index, Measurement.costs,
               Measurement.error_kind, Measurement.device_class)
        .where(Measurement.template == template.name,
               Measurement.template_version == int(template.version),
               Measurement.target == target, Measurement.state == MeasurementState.DONE,
               (Measurement.job_task_id.is_(None))
               | (Measurement.job_task_id != exclude_job_task))
        .order_by(Measurement.id.desc()).limit(limit)
    ).all()
    if device_class is not None:
        rows = closest_rows(rows, device_class)
    return [TransferRecord(key, template.name, int(index), _result(costs, error))
            for key, index, costs, error, _class in rows]


def closest_rows(rows: Sequence[Any], device_class: str) -> list[Any]:
    """The rows of the closest device level to ``device_class`` that has enough of them."""
    wanted = DeviceClass.parse(device_class)
    rank: dict[str | None, int] = {}
    for row in rows:
        if row[-1] not in rank:
            level = class_level(row[-1], wanted) if row[-1] else None
            rank[row[-1]] = LEVELS.index(level) if level is not None else len(LEVELS)
    for depth in range(len(LEVELS)):
        chosen = [row for row in rows if rank[row[-1]] <= depth]
        if len(chosen) >= MIN_LEVEL_RECORDS:
            return chosen
    return list(rows)


def _result(costs: list[Any] | None, error: ErrorKind | None) -> MeasureResult:
    if not error and costs:
        return MeasureResult(tuple(float(c) for c in costs))
    return MeasureResult.failure(error or ErrorKind.UNKNOWN, "")
