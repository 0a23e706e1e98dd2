"""The measurement queue as workers see it: register, claim (compare-and-set), heartbeat,
release, and returning expired leases. Every lease is timed by the database clock."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from schedule_templates.errors import ScheduleError
from schedule_templates.records import ErrorKind, MeasureResult
from tuner_service.db.clock import utcnow, utcnow_plus
from tuner_service.db.engine import Database
from tuner_service.db.models import Job, JobTask, Measurement, Worker
from tuner_service.jobs.device import class_of_hardware
from tuner_service.jobs.results import Lease, Measured, Outcome, store_result
from tuner_service.jobs.templates import SpaceCache

logger = logging.getLogger(__name__)


def register_worker(session: Session, body: dict[str, Any], token_id: int | None) -> Worker:
    worker = Worker(
        name=str(body.get("name") or ""), device_key=str(body["device_key"]),
        target=str(body["target"]), hardware=dict(body.get("hardware") or {}),
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


def live_workers(session: Session, target: str, device_key: str | None, window_s: float) -> int:
    """Workers seen within ``window_s`` (database clock) that can serve a job on this target and
    device key (a job without a device key is served by any worker of its target)."""
    query = select(func.count()).select_from(Worker).where(
        Worker.target == target, Worker.last_heartbeat >= utcnow_plus(-window_s))
    if device_key is not None:
        query = query.where(Worker.device_key == device_key)
    return int(session.scalar(query) or 0)


def claim(session: Session, worker: Worker, max_items: int, lease_s: float) -> list[int]:
    """Lease up to ``max_items`` queued measurements matching the worker's device and target.

    One guarded UPDATE: rows move from ``queued`` to ``leased`` only once, so two claimers never
    get the same item; on PostgreSQL the row pick also skips rows another claimer has locked.
    """
    pick = (
        select(Measurement.id)
        .where(Measurement.state == "queued", Measurement.target == worker.target,
               or_(Measurement.device_key.is_(None), Measurement.device_key == worker.device_key))
        .order_by(Measurement.id)
        .limit(max_items)
    )
    if session.get_bind().dialect.name == "postgresql":
        # A CTE runs once; "id IN (subquery ... LIMIT n)" may be re-run per row by the planner
        # and then lease more than n rows.
        picked = pick.with_for_update(skip_locked=True).cte("picked")
        where = Measurement.id == picked.c.id
    else:
        where = Measurement.id.in_(pick.scalar_subquery())  # SQLite writers are serialized
    stmt = (
        update(Measurement)
        .where(where, Measurement.state == "queued")
        .values(state="leased", lease_owner=worker.id, lease_expires_at=utcnow_plus(lease_s),
                claimed_at=utcnow(), attempts=Measurement.attempts + 1)
        .returning(Measurement.id)
        .execution_options(synchronize_session=False)
    )
    return sorted(session.scalars(stmt).all())


def claimed_items(session: Session, ids: Sequence[int], default_options: dict[str, Any]
                  ) -> list[dict[str, Any]]:
    """The protocol items for freshly claimed ids; configs that fail validation against their
    template's space are recorded as instantiation errors instead of being handed out."""
    rows = session.execute(
        select(Measurement, Job.options, Job.threads)
        .outerjoin(JobTask, JobTask.id == Measurement.job_task_id)
        .outerjoin(Job, Job.id == JobTask.job_id)
        .where(Measurement.id.in_(ids))
        .order_by(Measurement.id)
    ).all()
    spaces = SpaceCache()
    items = []
    for m, options, threads in rows:
        try:
            spaces.validate(m.template, m.template_version, m.workload_key, m.config)
        except ScheduleError as e:
            logger.warning("measurement %d has an invalid config: %s", m.id, e)
            store_result(session, m.id, MeasureResult.failure(ErrorKind.INSTANTIATION, str(e)))
            continue
        items.append({
            "measure_id": m.id, "template": m.template, "template_version": m.template_version,
            "workload": m.workload_key, "target": m.target, "config": m.config,
            "options": {**default_options, **(options or {})}, "threads": threads or 1,
        })
    return items


def heartbeat(session: Session, worker_id: int, ids: Sequence[int], lease_s: float
              ) -> tuple[list[int], list[int]]:
    touch_worker(session, worker_id)
    extended = set(session.scalars(
        update(Measurement)
        .where(Measurement.id.in_(list(ids)), Measurement.state == "leased",
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
        .where(Measurement.id.in_(list(ids)), Measurement.state == "leased",
               Measurement.lease_owner == worker_id)
        .values(state="queued", lease_owner=None, lease_expires_at=None,
                attempts=Measurement.attempts - 1)
        .returning(Measurement.id)
        .execution_options(synchronize_session=False)
    ).all())


def requeue_expired(session: Session, max_attempts: int) -> tuple[int, int]:
    """Expired leases go back to ``queued``; after ``max_attempts`` claims an item is recorded
    as a run timeout so a candidate that kills workers cannot loop forever.
    Returns (requeued, given up)."""
    expired = (Measurement.state == "leased", Measurement.lease_expires_at < utcnow())
    poisoned = session.scalars(
        select(Measurement.id).where(*expired, Measurement.attempts >= max_attempts)
    ).all()
    for measure_id in poisoned:
        store_result(session, measure_id, MeasureResult.failure(
            ErrorKind.RUN_TIMEOUT, f"lease expired {max_attempts} times; giving up"))
    requeued = session.scalars(
        update(Measurement).where(*expired)
        .values(state="queued", lease_owner=None, lease_expires_at=None)
        .returning(Measurement.id)
        .execution_options(synchronize_session=False)
    ).all()
    if requeued or poisoned:
        logger.info("requeued %d expired leases, gave up on %d", len(requeued), len(poisoned))
    return len(requeued), len(poisoned)


def claim_batch(db: Database, worker_id: int, max_items: int, lease_s: float,
                default_options: dict[str, Any]) -> list[dict[str, Any]]:
    """One claim attempt in its own transaction (the long-poll calls this repeatedly)."""
    def attempt(session: Session) -> list[dict[str, Any]]:
        worker = session.get(Worker, worker_id)
        if worker is None:
            return []
        touch_worker(session, worker_id)
        ids = claim(session, worker, max_items, lease_s)
        return claimed_items(session, ids, default_options) if ids else []

    return db.run(attempt)


def report_results(session: Session, worker: Worker,
                   results: Sequence[tuple[int, MeasureResult, float | None, str]],
                   measured: Mapping[int, Measured] | None = None) -> dict[str, Any]:
    """Store each (measure id, result, peak GFLOPS, problem found while decoding) of a worker.

    A result counts only on the worker's own live lease. Every result gets a status in
    ``statuses`` (accepted, duplicate, rejected, expired, not_leased_by_you, unknown); the
    older ``accepted``/``duplicates``/``rejected`` lists hold the same ids (refused ones are in
    ``rejected`` with their reason), so a worker drops every one of them from its spool.
    ``measured``: the device class and threads per measure id, as the worker reported them
    (a result without a class gets the one the worker registered with).
    """
    registered = Measured(class_of_hardware(worker.hardware))
    touch_worker(session, worker.id)
    answer: dict[str, Any] = {"accepted": [], "duplicates": [], "rejected": [], "statuses": []}
    lease = Lease(worker.id, worker.device_key)
    for measure_id, result, peak, problem in results:
        problem = problem or _result_problem(result)
        if problem:
            status = "rejected"
        else:
            device = (measured or {}).get(measure_id) or registered
            if device.device_class is None:
                device = dataclasses.replace(device, device_class=registered.device_class)
            outcome = store_result(session, measure_id, result, peak, worker.id, lease=lease,
                                   device=device)
            status, problem = _status(session, worker.id, measure_id, outcome)
        answer["statuses"].append({"measure_id": measure_id, "status": status,
                                   "reason": problem})
        if status == "accepted":
            answer["accepted"].append(measure_id)
        elif status == "duplicate":
            answer["duplicates"].append(measure_id)
        else:
            answer["rejected"].append({"measure_id": measure_id,
                                       "reason": f"{status}: {problem}" if problem else status})
    refused = [s for s in answer["statuses"] if s["status"] in ("expired", "not_leased_by_you")]
    if refused:
        logger.warning("worker %d reported %d result(s) it holds no live lease for: %s",
                       worker.id, len(refused), [s["measure_id"] for s in refused[:10]])
    return answer


def _status(session: Session, worker_id: int, measure_id: int, outcome: Outcome
            ) -> tuple[str, str]:
    """The protocol status of one stored (or refused) result, with a reason when refused."""
    if outcome is Outcome.ACCEPTED:
        return "accepted", ""
    if outcome is Outcome.DUPLICATE:
        return "duplicate", ""
    if outcome is Outcome.UNKNOWN:
        return "unknown", "unknown measure_id"
    row = session.execute(
        select(Measurement.state, Measurement.lease_owner,
               Measurement.lease_expires_at < utcnow())
        .where(Measurement.id == measure_id)).first()
    if row is not None and row[0] == "leased" and row[1] == worker_id and row[2]:
        return "expired", "the lease expired before the result arrived; it is measured again"
    return "not_leased_by_you", "this worker holds no lease on the measurement"


def _result_problem(result: MeasureResult) -> str:
    if result.error is ErrorKind.NONE and not result.costs:
        return "error_kind 0 needs at least one cost"
    if any(not math.isfinite(c) or c <= 0 for c in result.costs):
        return "costs must be positive finite seconds"
    return ""
