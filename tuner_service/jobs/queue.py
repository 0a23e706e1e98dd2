"""The measurement queue as workers see it: register, claim (compare-and-set), heartbeat,
release, and returning expired leases. Every lease is timed by the database clock."""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Integer, Row, Select, String, Update, bindparam, or_, select, update
from sqlalchemy.orm import Session

from schedule_templates.errors import ScheduleError
from schedule_templates.protocol import Candidate, ClaimItem, Report, Target
from schedule_templates.records import ErrorKind, MeasureOptions, MeasureResult
from tuner_service.db.bulk import ids_in
from tuner_service.db.clock import utcnow, utcnow_plus
from tuner_service.db.engine import Database
from tuner_service.db.models import Job, JobTask, Measurement, Worker
from tuner_service.db.states import MeasurementState, ReportStatus
from tuner_service.jobs.device import class_of_hardware
from tuner_service.jobs.reports import store_reported
from tuner_service.jobs.results import store_result

logger = logging.getLogger(__name__)


def register_worker(session: Session, body: dict[str, Any], token_id: int | None) -> Worker:
    worker = Worker(
        name=str(body.get("name") or ""), device_key=str(body["device_key"]),
        target=str(Target.parse(str(body["target"]))), hardware=dict(body.get("hardware") or {}),
        software=dict(body.get("software") or {}), token_id=token_id,
    )
    session.add(worker)
    session.flush()
    touch_worker(session, worker.id)
    logger.info("worker %d registered (%s, %s)", worker.id, worker.device_key, worker.target)
    return worker


def touch_worker(session: Session, worker_id: int) -> None:
    session.execute(update(Worker).where(Worker.id == worker_id).values(last_heartbeat=utcnow())
                    .execution_options(synchronize_session=False))


def serving_workers(session: Session, target: str, device_key: str | None,
                    window_s: float | None = None) -> list[Any]:
    """(target, hardware, id) of the workers that can serve a job on this target and device key
    (``Target.serves``; a job without a device key is served by any worker of its target),
    seen within ``window_s`` (database clock) when given; the latest seen first."""
    job = Target.parse(target)
    query = (select(Worker.target, Worker.hardware, Worker.id)
             .where(Worker.target.startswith(job.kind))
             .order_by(Worker.last_heartbeat.desc().nulls_last(), Worker.id.desc()))
    if window_s is not None:
        query = query.where(Worker.last_heartbeat >= utcnow_plus(-window_s))
    if device_key is not None:
        query = query.where(Worker.device_key == device_key)
    return [row for row in session.execute(query) if Target.parse(row.target).serves(job)]


def live_workers(session: Session, target: str, device_key: str | None, window_s: float) -> int:
    """How many ``serving_workers`` were seen within ``window_s``."""
    return len(serving_workers(session, target, device_key, window_s))


def live_worker_ids(session: Session, target: str, device_key: str | None, window_s: float
                    ) -> list[int]:
    """The ids of the ``serving_workers`` seen within ``window_s``."""
    return [int(row.id) for row in serving_workers(session, target, device_key, window_s)]


def claim(session: Session, worker: Worker, max_items: int, lease_s: float) -> list[int]:
    """Lease up to ``max_items`` queued measurements matching the worker's device and target.

    One guarded UPDATE: rows move from ``queued`` to ``leased`` only once, so two claimers never
    get the same item; on PostgreSQL the row pick also skips rows another claimer has locked.
    """
    stmt = _claim_ids(_postgres(session), _served(worker), float(lease_s))
    return sorted(session.scalars(stmt, _lease_params(worker, max_items)).all())


def _postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def _served(worker: Worker) -> tuple[str, ...]:
    return tuple(Target.parse(worker.target).served())


def _lease_params(worker: Worker, max_items: int) -> dict[str, Any]:
    return {"claim_worker": worker.id, "claim_device": worker.device_key,
            "claim_limit": max_items}


# The claim statements are built once per (dialect, the job targets a worker serves, lease)
# and reused: constructing one (dozens of clause objects, a CTE's column collection) cost more
# server time than running it. Statements are immutable, so one object serves every thread;
# the worker, its device key and the number of items are bound at execution (_lease_params).

def _lease(postgres: bool, served: tuple[str, ...], lease_s: float, skip_locked: bool = True
           ) -> Update:
    """``claim``'s guarded UPDATE, without its RETURNING."""
    pick = (
        select(Measurement.id)
        .where(Measurement.state == MeasurementState.QUEUED, Measurement.target.in_(served),
               or_(Measurement.device_key.is_(None),
                   Measurement.device_key == bindparam("claim_device", type_=String)))
        .order_by(Measurement.id)
        .limit(bindparam("claim_limit", type_=Integer))
    )
    if postgres:
        # A CTE runs once; "id IN (subquery ... LIMIT n)" may be re-run per row by the planner
        # and then lease more than n rows.
        picked = pick.with_for_update(skip_locked=skip_locked).cte("picked")
        where = Measurement.id == picked.c.id
    else:
        where = Measurement.id.in_(pick.scalar_subquery())  # SQLite writers are serialized
    return (
        update(Measurement)
        .where(where, Measurement.state == MeasurementState.QUEUED)
        .values(state=MeasurementState.LEASED,
                lease_owner=bindparam("claim_worker", type_=Integer),
                lease_expires_at=utcnow_plus(lease_s), claimed_at=utcnow(),
                attempts=Measurement.attempts + 1)
        .execution_options(synchronize_session=False)
    )


@functools.lru_cache(maxsize=64)
def _claim_ids(postgres: bool, served: tuple[str, ...], lease_s: float) -> Update:
    return _lease(postgres, served, lease_s).returning(Measurement.id)


#: what a claimed item is made of: the measurement's columns, its job's options and threads
_ITEM_COLUMNS = (Measurement.id, Measurement.template, Measurement.template_version,
                 Measurement.workload_key, Measurement.target, Measurement.config)


def _item_rows(session: Session, ids: Sequence[int]) -> Sequence[Row[Any]]:
    return session.execute(
        select(*_ITEM_COLUMNS, Job.options, Job.threads)  # plain rows: no ORM objects here
        .outerjoin(JobTask, JobTask.id == Measurement.job_task_id)
        .outerjoin(Job, Job.id == JobTask.job_id)
        .where(ids_in(session, Measurement.id, ids))
        .order_by(Measurement.id)
    ).all()


@functools.lru_cache(maxsize=64)
def _claim_items_postgres(served: tuple[str, ...], lease_s: float, skip_locked: bool
                          ) -> Select[Any]:
    """The worker's heartbeat, the lease and the read of the leased items as one statement (one
    round trip): ``WITH touched AS (UPDATE workers ...), picked AS (SELECT ... FOR UPDATE SKIP
    LOCKED), claimed AS (UPDATE measurements ... RETURNING ...) SELECT ... FROM claimed``.
    PostgreSQL runs every data-modifying WITH part exactly once, read or not."""
    touched = (update(Worker)
               .where(Worker.id == bindparam("claim_worker", type_=Integer))
               .values(last_heartbeat=utcnow()).returning(Worker.id).cte("touched"))
    claimed = (_lease(True, served, lease_s, skip_locked)
               .returning(*_ITEM_COLUMNS, Measurement.job_task_id).cte("claimed"))
    return (
        select(claimed.c.id, claimed.c.template, claimed.c.template_version,
               claimed.c.workload_key, claimed.c.target, claimed.c.config, Job.options,
               Job.threads)
        .select_from(claimed)
        .outerjoin(JobTask, JobTask.id == claimed.c.job_task_id)
        .outerjoin(Job, Job.id == JobTask.job_id)
        .order_by(claimed.c.id)
        .add_cte(touched)
    )


def claimed_items(session: Session, ids: Sequence[int], default_options: dict[str, Any]
                  ) -> list[ClaimItem]:
    """The protocol items for freshly claimed ids (``_items``)."""
    return _items(session, _item_rows(session, ids), default_options)


def _items(session: Session, rows: Sequence[Row[Any]], default_options: dict[str, Any]
           ) -> list[ClaimItem]:
    """The protocol items of claimed rows. A row is decoded into its candidate here
    (the database is a boundary: a row may have been edited or written by an older server);
    one that does not fit its template's space is recorded as an instantiation error instead
    of being handed out (spaces and workloads are cached: decoding costs little)."""
    items = []
    for m in rows:
        candidate = Candidate(m.template, m.workload_key, m.config, m.template_version)
        try:
            candidate.decode()
        except ScheduleError as e:
            logger.warning("measurement %d has an invalid config: %s", m.id, e)
            store_result(session, m.id, MeasureResult.failure(ErrorKind.INSTANTIATION, str(e)))
            continue
        options = MeasureOptions.from_json({**default_options, **(m.options or {})})
        items.append(ClaimItem(m.id, candidate, Target.parse(m.target), options,
                               m.threads or 1))
    return items


def heartbeat(session: Session, worker_id: int, ids: Sequence[int], lease_s: float
              ) -> tuple[list[int], list[int]]:
    touch_worker(session, worker_id)
    extended = set(session.scalars(
        update(Measurement)
        .where(Measurement.id.in_(list(ids)), Measurement.state == MeasurementState.LEASED,
               Measurement.lease_owner == worker_id)
        .values(lease_expires_at=utcnow_plus(lease_s))
        .returning(Measurement.id)
        .execution_options(synchronize_session=False)
    ).all())
    return sorted(extended), sorted(set(ids) - extended)


def release(session: Session, worker_id: int, ids: Sequence[int]) -> list[int]:
    """Give leased items back at once; a release does not count as an attempt."""
    touch_worker(session, worker_id)
    return sorted(session.scalars(
        update(Measurement)
        .where(Measurement.id.in_(list(ids)), Measurement.state == MeasurementState.LEASED,
               Measurement.lease_owner == worker_id)
        .values(state=MeasurementState.QUEUED, lease_owner=None, lease_expires_at=None,
                attempts=Measurement.attempts - 1)
        .returning(Measurement.id)
        .execution_options(synchronize_session=False)
    ).all())


def requeue_expired(session: Session, max_attempts: int) -> tuple[int, int]:
    """Expired leases go back to ``queued``; after ``max_attempts`` claims an item is recorded
    as a run timeout so a candidate that kills workers cannot loop forever.
    Returns (requeued, given up)."""
    expired = (Measurement.state == MeasurementState.LEASED,
               Measurement.lease_expires_at < utcnow())
    poisoned = session.scalars(
        select(Measurement.id).where(*expired, Measurement.attempts >= max_attempts)
    ).all()
    for measure_id in poisoned:
        store_result(session, measure_id, MeasureResult.failure(
            ErrorKind.RUN_TIMEOUT, f"lease expired {max_attempts} times; giving up"))
    requeued = session.scalars(
        update(Measurement).where(*expired)
        .values(state=MeasurementState.QUEUED, lease_owner=None, lease_expires_at=None)
        .returning(Measurement.id)
        .execution_options(synchronize_session=False)
    ).all()
    if requeued or poisoned:
        logger.info("requeued %d expired leases, gave up on %d", len(requeued), len(poisoned))
    return len(requeued), len(poisoned)


def claim_batch(db: Database, worker: Worker, max_items: int, lease_s: float,
                default_options: dict[str, Any]) -> list[ClaimItem]:
    """One claim attempt in its own transaction (the long-poll calls this repeatedly): the
    worker's heartbeat, one guarded UPDATE and one read of the items, whatever ``max_items``;
    on PostgreSQL the three are one statement (``_claim_items_postgres``).
    ``worker``: the row the request authorised (its target and device key are all we need)."""
    def attempt(session: Session) -> list[ClaimItem]:
        if _postgres(session):
            served, params = _served(worker), _lease_params(worker, max_items)
            rows = session.execute(_claim_items_postgres(served, lease_s, True), params).all()
            if not rows:
                # Every queued row may be locked by claims still committing, which SKIP LOCKED
                # passed over: wait for those (short, single-statement transactions, rows
                # locked in id order) and take what they left, instead of answering a worker
                # "nothing" while work is queued. An empty queue costs this and the next statement.
                rows = session.execute(_claim_items_postgres(served, lease_s, False),
                                       params).all()
            if not rows:
                # The rows it waited for were all taken meanwhile: after the wait PostgreSQL
                # rechecks them, drops those no longer queued and does not look past its
                # LIMIT. What was queued behind them is free now (seen at 256 workers).
                rows = session.execute(_claim_items_postgres(served, lease_s, True),
                                       params).all()
            return _items(session, rows, default_options)
        touch_worker(session, worker.id)
        ids = claim(session, worker, max_items, lease_s)
        return claimed_items(session, ids, default_options) if ids else []

    return db.run(attempt)


def report_results(session: Session, worker: Worker, reported: Sequence[Report],
                   problems: Mapping[int, str] | None = None) -> dict[str, Any]:
    """Store a worker's results in one transaction (``reports.store_reported``).

    A result counts only on the worker's own live lease. Every result gets a status in
    ``statuses`` (accepted, duplicate, rejected, expired, not_leased_by_you, unknown); the
    older ``accepted``/``duplicates``/``rejected`` lists hold the same ids (refused ones are in
    ``rejected`` with their reason), so a worker drops every one of them from its spool.
    ``problems``: why a result was refused while decoding (it is then not stored). A result
    without a device class gets the one the worker registered with.
    """
    registered = class_of_hardware(worker.hardware)
    touch_worker(session, worker.id)
    found = [(problems or {}).get(int(r.measure_id)) or _result_problem(r.result)
             for r in reported]
    storable = [r if r.device_class is not None else dataclasses.replace(
        r, device_class=registered)
        for r, problem in zip(reported, found, strict=True) if not problem]
    stored = iter(store_reported(session, worker.id, worker.device_key, storable))
    answer: dict[str, Any] = {"accepted": [], "duplicates": [], "rejected": [], "statuses": []}
    for item, problem in zip(reported, found, strict=True):
        status, reason = (ReportStatus.REJECTED, problem) if problem else next(stored)
        answer["statuses"].append({"measure_id": item.measure_id, "status": status,
                                   "reason": reason})
        if status is ReportStatus.ACCEPTED:
            answer["accepted"].append(item.measure_id)
        elif status is ReportStatus.DUPLICATE:
            answer["duplicates"].append(item.measure_id)
        else:
            answer["rejected"].append({"measure_id": item.measure_id,
                                       "reason": f"{status}: {reason}" if reason else status})
    refused = [s for s in answer["statuses"]
               if s["status"] in (ReportStatus.EXPIRED, ReportStatus.NOT_LEASED_BY_YOU)]
    if refused:
        logger.warning("worker %d reported %d result(s) it holds no live lease for: %s",
                       worker.id, len(refused), [s["measure_id"] for s in refused[:10]])
    return answer


def _result_problem(result: MeasureResult) -> str:
    if result.error is ErrorKind.NONE and not result.costs:
        return "error_kind 0 needs at least one cost"
    if any(not math.isfinite(c) or c <= 0 for c in result.costs):
        return "costs must be positive finite seconds"
    return ""
