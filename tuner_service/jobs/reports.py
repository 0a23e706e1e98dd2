"""A worker's batch of results stored in one transaction, with a fixed number of statements.

A report of n results costs the same few round trips whatever n is: one ``SELECT`` reads (and on
PostgreSQL row-locks, in id order) every reported measurement, Python decides each result's
status from that snapshot, one ``UPDATE`` (executemany, pipelined by the driver) finishes the
accepted ones, and two more add their trial counts and bests to their job tasks, grouped per
task. The rules are those of ``results.store_result`` with a lease: a result counts only on the
reporting worker's own live lease (database clock) for its device key; a second report of a
finished measurement by the same worker is a duplicate; anything else changes nothing.

The row locks (PostgreSQL) or the write lock (SQLite's ``BEGIN IMMEDIATE``) keep the snapshot
true until the transaction ends: a lease cannot lapse into a requeue between the read and the
update.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Sequence
from typing import Any, cast

from sqlalchemy import Table, Update, bindparam, or_, select, update
from sqlalchemy.orm import Session

from schedule_templates.protocol import Report
from schedule_templates.records import MeasureResult
from tuner_service.db.bulk import ids_in, json_rows
from tuner_service.db.clock import utcnow
from tuner_service.db.models import JobTask, Measurement
from tuner_service.db.states import MeasurementState, ReportStatus
from tuner_service.jobs.results import (
    CONFIRM,
    STORED_RESULTS_INFO,
    update_tuning_log,
)

#: the parts of a worker's time per candidate a result may carry (seconds each)
TIMING_PARTS = ("wait_s", "claim_s", "build_s", "check_s", "measure_s", "report_s")

EXPIRED = "the lease expired before the result arrived; it is measured again"
NOT_LEASED = "this worker holds no lease on the measurement"


@dataclasses.dataclass(frozen=True)
class _Row:
    """What the report needs to know of one stored measurement."""

    id: int
    state: MeasurementState
    lease_owner: int | None
    live: bool
    device_key: str | None
    worker_id: int | None
    job_task_id: int | None
    purpose: str


def store_reported(session: Session, worker_id: int, device_key: str,
                   reported: Sequence[Report]) -> list[tuple[ReportStatus, str]]:
    """(status, reason) of each reported result, in order: accepted, duplicate, expired,
    not_leased_by_you or unknown. A measure id reported twice in one batch counts once (the
    second is a duplicate)."""
    ids = [int(r.measure_id) for r in reported]  # the server's ids (``ResultIn``) are integers
    rows = _lock_rows(session, sorted(set(ids)))
    statuses: list[tuple[ReportStatus, str]] = []
    seen: set[int] = set()
    accepted: list[tuple[_Row, Report]] = []
    for measure_id, item in zip(ids, reported, strict=True):
        status = (ReportStatus.DUPLICATE, "") if measure_id in seen else \
            _judge(rows.get(measure_id), worker_id, device_key)
        seen.add(measure_id)
        statuses.append(status)
        if status[0] is ReportStatus.ACCEPTED:
            accepted.append((rows[measure_id], item))
    if accepted:
        _finish(session, worker_id, [item for _row, item in accepted])
        _count_trials(session, [(row, item.result) for row, item in accepted])
        _log_unattached(session, [row.id for row, item in accepted
                                  if row.job_task_id is None and item.result.ok])
        session.info.setdefault(STORED_RESULTS_INFO, []).extend(
            int(item.result.error) for _row, item in accepted)
    return statuses


def _lock_rows(session: Session, ids: list[int]) -> dict[int, _Row]:
    if not ids:
        return {}
    query = (select(Measurement.id, Measurement.state, Measurement.lease_owner,
                    Measurement.lease_expires_at >= utcnow(), Measurement.device_key,
                    Measurement.worker_id, Measurement.job_task_id, Measurement.purpose)
             .where(ids_in(session, Measurement.id, ids)).order_by(Measurement.id))
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(of=Measurement)  # id order: reporters never cross locks
    return {row[0]: _Row(int(row[0]), row[1], row[2], bool(row[3]), row[4], row[5], row[6],
                         row[7] or "tune")
            for row in session.execute(query)}


def _judge(row: _Row | None, worker_id: int, device_key: str) -> tuple[ReportStatus, str]:
    if row is None:
        return ReportStatus.UNKNOWN, "unknown measure_id"
    mine = row.state == MeasurementState.LEASED and row.lease_owner == worker_id
    if mine and row.live and row.device_key in (None, device_key):
        return ReportStatus.ACCEPTED, ""
    if row.state == MeasurementState.DONE and row.worker_id == worker_id:
        return ReportStatus.DUPLICATE, ""
    if mine and not row.live:
        return ReportStatus.EXPIRED, EXPIRED
    return ReportStatus.NOT_LEASED_BY_YOU, NOT_LEASED


#: the result columns a report writes (``_finish``)
_RESULT_COLUMNS = ("costs", "mean_cost", "error_kind", "error_message", "compile_time_s",
                   "wall_time_s", "peak_gflops", "device_class", "threads", "noisy", "load",
                   "timings")


@functools.lru_cache(maxsize=4)
def _finish_statement(postgres: bool) -> Update:
    """The UPDATE that finishes accepted results, built once (the worker is bound). On
    PostgreSQL one statement for the whole batch, its rows joined from one JSON parameter
    (the rows are locked already, by ``_lock_rows``); elsewhere one execution per result."""
    table = cast(Table, Measurement.__table__)
    if postgres:
        rows = json_rows(table, ("id", *_RESULT_COLUMNS), "m_rows")
        key, values = rows.c.id, {c: rows.c[c] for c in _RESULT_COLUMNS}
    else:
        key, values = bindparam("m_id"), {c: bindparam(f"m_{c}") for c in _RESULT_COLUMNS}
    worker = bindparam("m_worker", type_=table.c.worker_id.type)
    return (update(table)
            .where(table.c.id == key, table.c.state == MeasurementState.LEASED,
                   table.c.lease_owner == worker)
            .values(state=MeasurementState.DONE, worker_id=worker, finished_at=utcnow(),
                    lease_owner=None, lease_expires_at=None, **values))


def _finish(session: Session, worker_id: int, accepted: Sequence[Report]) -> None:
    """The accepted results stored: one statement (``_finish_statement``)."""
    postgres = session.get_bind().dialect.name == "postgresql"
    params = []
    for item in accepted:
        result, ok = item.result, item.result.ok
        values: dict[str, Any] = {
            "id": item.measure_id, "costs": list(result.costs),
            "mean_cost": result.mean_cost if ok else None, "error_kind": int(result.error),
            "error_message": result.error_message, "compile_time_s": result.compile_time_s,
            "wall_time_s": result.wall_time_s, "peak_gflops": item.peak_gflops,
            "device_class": item.device_class, "threads": item.threads,
            "noisy": result.noisy if ok else None, "load": result.load,
            "timings": dict(item.timings) if item.timings else None,
        }
        params.append(values if postgres else {f"m_{k}": v for k, v in values.items()})
    if postgres:
        session.execute(_finish_statement(True), {"m_rows": params, "m_worker": worker_id})
    else:
        session.execute(_finish_statement(False),
                        [{**values, "m_worker": worker_id} for values in params])


def _count_trials(session: Session, done: Iterable[tuple[_Row, MeasureResult]]) -> None:
    """Trials and bests of the job tasks the accepted results belong to, one statement each
    (re-measurements of top candidates are not trials)."""
    counts: dict[int, int] = {}
    best: dict[int, tuple[float, int]] = {}
    for row, result in done:
        if row.job_task_id is None or row.purpose == CONFIRM:
            continue
        counts[row.job_task_id] = counts.get(row.job_task_id, 0) + 1
        cost = result.mean_cost if result.ok else math.inf
        if math.isfinite(cost) and cost < best.get(row.job_task_id, (math.inf, 0))[0]:
            best[row.job_task_id] = (cost, row.id)
    if not counts:
        return
    table = cast(Table, JobTask.__table__)
    # sorted: concurrent reports lock the shared task rows in one order
    session.execute(
        update(table).where(table.c.id == bindparam("t_id"))
        .values(trials_done=table.c.trials_done + bindparam("t_n")),
        [{"t_id": t, "t_n": n} for t, n in sorted(counts.items())])
    if best:
        session.execute(
            update(table).where(table.c.id == bindparam("t_id"),
                                or_(table.c.best_cost.is_(None),
                                    table.c.best_cost > bindparam("t_cost")))
            .values(best_cost=bindparam("t_cost"), best_measurement_id=bindparam("t_m")),
            [{"t_id": t, "t_cost": c, "t_m": m} for t, (c, m) in sorted(best.items())])


def _log_unattached(session: Session, ids: Sequence[int]) -> None:
    """Results of measurements outside any job go to the shared log at once (rare: most
    reports have none, and then no statement is sent)."""
    if not ids:
        return
    for measurement in session.scalars(select(Measurement).where(Measurement.id.in_(ids))):
        update_tuning_log(session, measurement, job_id=None)
