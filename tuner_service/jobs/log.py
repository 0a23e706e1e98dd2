"""Queries over the shared tuning log and the worker list."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.workloads import parse_workload
from tuner_service.db.clock import utcnow
from tuner_service.db.models import TuningLogEntry, Worker
from tuner_service.db.values import bounded_json
from tuner_service.errors import InvalidInputError, NotFoundError
from tuner_service.jobs import device
from tuner_service.jobs.templates import template_for
from tuner_service.jobs.views import iso


def entry_json(e: TuningLogEntry) -> dict[str, Any]:
    return {
        "workload": e.workload_key, "op": e.op, "target": e.target, "template": e.template,
        "template_version": e.template_version, "config": e.config, "mean_cost": e.mean_cost,
        "gflops": e.gflops, "measurement_id": e.measurement_id, "job_id": e.job_id,
        "device_key": e.device_key, "device_class": e.device_class, "threads": e.threads,
        "spread": e.spread, "confirmed": e.confirmed, "updated_at": iso(e.updated_at),
    }


def canonical_key(key: str) -> str:
    try:
        return parse_workload(key).key
    except InvalidWorkloadError as e:
        raise InvalidInputError(str(e)) from e


def best(session: Session, workload: str, target: str, device_class: str | None = None,
         threads: int | None = None) -> dict[str, Any]:
    """The best config for ``workload`` on ``target`` for a device class and thread count.

    Levels (``match`` in the answer): the exact class, the same microarchitecture, the same ISA
    level, else the template default (see ``jobs.device``); without a device class, the
    fastest entry of any class (``any``), 404 when there is none. A fused workload
    (``...,epilogue=bias+relu``) and its base share one search space, so the family serves it
    when the exact key has no entry; the answer's ``workload`` says which key was measured.
    """
    key = canonical_key(workload)
    query = device.DeviceQuery.parse(device_class, threads)
    found = device.resolve(session, key, target, query)
    if found is not None:
        entry, level = found
        return {**entry_json(entry), "match": level.value}
    if query.device_class is None:
        raise NotFoundError(f"no tuned config for {key} on {target}")
    return default_answer(key, target, query.threads)


def default_answer(key: str, target: str, threads: int) -> dict[str, Any]:
    """The template default for ``key``: what a build uses when nothing related is tuned."""
    workload = parse_workload(key)
    template = template_for(workload.op, target)
    if template is None:
        raise NotFoundError(f"no tuned config for {key} on {target}, and no template for "
                            f"{workload.op} there")
    return {
        "workload": key, "op": workload.op, "target": target, "template": template.name,
        "template_version": int(template.version),
        "config": template.default_config(workload).to_json(), "mean_cost": None,
        "gflops": None, "measurement_id": None, "job_id": None, "device_key": None,
        "device_class": None, "threads": threads, "spread": None, "confirmed": False,
        "updated_at": None, "match": device.Match.DEFAULT.value,
    }


def entries(session: Session, op: str | None, target: str | None, workload: str | None,
            limit: int = 1000, device_class: str | None = None) -> list[dict[str, Any]]:
    query = select(TuningLogEntry)
    if device_class:
        query = query.where(TuningLogEntry.device_class == device_class)
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
            "hardware": _facts(w.hardware), "software": _facts(w.software),
            "registered_at": iso(w.registered_at), "last_heartbeat": iso(seen), "online": online,
        })
    return out


#: what a worker's stored facts must pass to be listed (the same bound as at registration)
_FACTS_BOUND = bounded_json(64 * 1024, 8)


def _facts(value: Any) -> dict[str, Any]:
    """A worker's stored facts, or a note when a row stored before the input checks cannot be
    sent (nested too deep, not finite): one bad row must not break the list for everyone."""
    try:
        _FACTS_BOUND(value)
    except (ValueError, TypeError, RecursionError):
        return {"unreadable": "stored facts fail the input checks; register the worker again"}
    return value if isinstance(value, dict) else {}


def _as_utc(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    if isinstance(value, str):  # SQLite returns the raw text of an expression
        value = dt.datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
