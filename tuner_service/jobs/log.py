"""Queries over the shared tuning log and the worker list."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.workloads import parse_workload
from tuner_service.db.clock import utcnow
from tuner_service.db.errors import InvalidInputError, NotFoundError
from tuner_service.db.models import TuningLogEntry, Worker
from tuner_service.jobs.views import iso


def entry_json(e: TuningLogEntry) -> dict[str, Any]:
    return {
        "workload": e.workload_key, "op": e.op, "target": e.target, "template": e.template,
        "template_version": e.template_version, "config": e.config, "mean_cost": e.mean_cost,
        "gflops": e.gflops, "measurement_id": e.measurement_id, "job_id": e.job_id,
        "device_key": e.device_key, "updated_at": iso(e.updated_at),
    }


def canonical_key(key: str) -> str:
    try:
        return parse_workload(key).key
    except InvalidWorkloadError as e:
        raise InvalidInputError(str(e)) from e


def best(session: Session, workload: str, target: str) -> dict[str, Any]:
    """The best config for ``workload`` on ``target``.

    A fused workload (``...,epilogue=bias+relu``) and its base share one search space, so when
    the exact key has no entry, the family serves it: the base key's entry first, else the
    fastest entry of a sibling epilogue. The answer's ``workload`` says which key was measured.
    """
    key = canonical_key(workload)
    entry = session.scalar(select(TuningLogEntry).where(
        TuningLogEntry.workload_key == key, TuningLogEntry.target == target))
    if entry is None:
        entry = _family_best(session, key, target)
    if entry is None:
        raise NotFoundError(f"no tuned config for {key} on {target}")
    return entry_json(entry)


def _family_best(session: Session, key: str, target: str) -> TuningLogEntry | None:
    base = parse_workload(key).base_key
    # the epilogue is a key's last parameter: every fused variant starts with this prefix
    family = session.scalars(select(TuningLogEntry).where(
        TuningLogEntry.target == target,
        or_(TuningLogEntry.workload_key == base,
            TuningLogEntry.workload_key.startswith(f"{base},epilogue=", autoescape=True)),
    )).all()
    if not family:
        return None
    return min(family, key=lambda e: (e.workload_key != base, -e.template_version,
                                      e.mean_cost, e.workload_key))


def entries(session: Session, op: str | None, target: str | None, workload: str | None,
            limit: int = 1000) -> list[dict[str, Any]]:
    query = select(TuningLogEntry)
    if op:
        query = query.where(TuningLogEntry.op == op)
    if target:
        query = query.where(TuningLogEntry.target == target)
    if workload:
        query = query.where(TuningLogEntry.workload_key == canonical_key(workload))
    rows = session.scalars(query.order_by(TuningLogEntry.op, TuningLogEntry.workload_key)
                           .limit(limit))
    return [entry_json(e) for e in rows]


def workers(session: Session, heartbeat_s: float) -> list[dict[str, Any]]:
    now = _as_utc(session.scalar(select(utcnow())))
    out = []
    for w in session.scalars(select(Worker).order_by(Worker.id)):
        seen = _as_utc(w.last_heartbeat)
        online = bool(now and seen and (now - seen).total_seconds() < 3 * heartbeat_s)
        out.append({
            "worker_id": w.id, "name": w.name, "device_key": w.device_key, "target": w.target,
            "hardware": w.hardware, "software": w.software,
            "registered_at": iso(w.registered_at), "last_heartbeat": iso(seen), "online": online,
        })
    return out


def _as_utc(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    if isinstance(value, str):  # SQLite returns the raw text of an expression
        value = dt.datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
