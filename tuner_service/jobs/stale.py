"""Which shared-log entries a refresh should tune again, and why, per device class.

Best configs are kept per (workload, target, device class, threads), and a refresh works on
the device classes that have online workers (a job for a class nobody serves would wait
forever). For each (target, device class) with an online worker, each workload the log knows:

* ``template``: its entry for that class was measured with another template, or an older
  version of the template that now serves its operator on its target;
* ``age``: no successful measurement of its (workload, target, class) finished within the
  window. A re-measurement that did not beat the stored best still counts as fresh, so a
  refresh that confirms an entry is not repeated the next night;
* ``missing``: the class has no entry for it (entries of class ``unknown``, recorded before
  classes existed, serve no class: they are tuned again on every class that has workers).

An item names a device key of an online worker of its class, so its job runs there, and the
thread count of the entry it refreshes. Stale entries whose class has no online worker are
reported as ``skipped`` (with the reason), not as work.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from schedule_templates.records import ErrorKind
from tuner_service.db.clock import utcnow, utcnow_plus
from tuner_service.db.models import Measurement, TuningLogEntry, Worker
from tuner_service.db.states import MeasurementState
from tuner_service.jobs.device import class_of_hardware
from tuner_service.jobs.templates import template_for
from workers.device_class import UNKNOWN

#: a worker is online when heard from within this many heartbeat periods (as GET /workers)
ONLINE_HEARTBEATS = 3
REASONS = ("template", "age", "missing")
#: (target, device class) -> device keys of its online workers
Online = dict[tuple[str, str], set[str]]


@dataclasses.dataclass(frozen=True)
class StaleItem:
    workload: str
    op: str
    target: str
    reason: str
    detail: str
    #: the device the refresh job should measure on (None: any online worker of the target)
    device_key: str | None = None
    template: str | None = None
    template_version: int | None = None
    current_template: str | None = None
    current_version: int | None = None
    last_measured_at: dt.datetime | None = None
    gflops: float | None = None
    #: the class whose entry is refreshed, and the thread count to measure with
    device_class: str | None = None
    threads: int | None = None

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["last_measured_at"] = self.last_measured_at.isoformat() if self.last_measured_at \
            else None
        return out


@dataclasses.dataclass
class StaleReport:
    checked_at: dt.datetime
    older_than_days: float
    items: list[StaleItem]
    skipped: list[StaleItem]

    def to_json(self) -> dict[str, Any]:
        return {"checked_at": self.checked_at.isoformat(),
                "older_than_days": self.older_than_days,
                "items": [i.to_json() for i in self.items],
                "skipped": [i.to_json() for i in self.skipped]}


def find_stale(session: Session, older_than_days: float, heartbeat_s: float,
               target: str | None = None, limit: int = 10_000) -> StaleReport:
    now = _utc(session.scalar(select(utcnow())))
    assert now is not None
    cutoff = now - dt.timedelta(days=older_than_days)
    query = select(TuningLogEntry).order_by(TuningLogEntry.target, TuningLogEntry.workload_key)
    if target:
        query = query.where(TuningLogEntry.target == target)
    entries = list(session.scalars(query))
    online = {k: v for k, v in _online_classes(session, heartbeat_s).items()
              if not target or k[0] == target}
    last = _last_measured(session, target)
    items, skipped = [], []
    for entry in entries:
        when = last.get((entry.workload_key, entry.target, entry.device_class)) \
            or _utc(entry.updated_at)
        item = _judge(entry, when, now, cutoff)
        if item is None or entry.device_class == UNKNOWN:
            continue  # unknown entries are replaced per class, as ``missing``
        devices = online.get((entry.target, entry.device_class), set())
        if item.current_template is None:
            skipped.append(item)
        elif not devices:
            skipped.append(dataclasses.replace(
                item, detail=f"{item.detail}; no online worker of device class "
                             f"{entry.device_class} for target {entry.target!r}"))
        else:
            keep = entry.device_key if entry.device_key in devices else min(devices)
            items.append(dataclasses.replace(item, device_key=keep))
    items.extend(_missing(entries, online))
    skipped.extend(_unserved_unknown(entries, online, now, cutoff, last))
    items.sort(key=lambda i: (REASONS.index(i.reason), i.target, i.device_class or "",
                              i.workload))
    return StaleReport(checked_at=now, older_than_days=older_than_days, items=items[:limit],
                       skipped=skipped)


def _judge(entry: TuningLogEntry, when: dt.datetime | None, now: dt.datetime,
           cutoff: dt.datetime) -> StaleItem | None:
    current = template_for(entry.op, entry.target)
    base = StaleItem(
        workload=entry.workload_key, op=entry.op, target=entry.target, reason="template",
        detail="", device_key=entry.device_key, template=entry.template,
        template_version=entry.template_version,
        current_template=current.name if current else None,
        current_version=int(current.version) if current else None,
        last_measured_at=when, gflops=entry.gflops, device_class=entry.device_class,
        threads=entry.threads)
    if current is None:
        return dataclasses.replace(base, detail=f"no template for {entry.op} on {entry.target}")
    if entry.template != current.name or entry.template_version < int(current.version):
        return dataclasses.replace(
            base, detail=f"measured with {entry.template} v{entry.template_version}; "
                         f"now {current.name} v{current.version}")
    if when is None:
        return dataclasses.replace(base, reason="age", detail="never measured here")
    if when < cutoff:
        days = (now - when).total_seconds() / 86400
        return dataclasses.replace(
            base, reason="age", detail=f"last measured {days:.1f} days ago ({when:%Y-%m-%d})")
    return None


def _missing(entries: list[TuningLogEntry], online: Online) -> list[StaleItem]:
    """Workloads the log knows (on any target or class) without an entry of a (target,
    device class) that has online workers."""
    known: dict[str, str] = {}
    have: dict[tuple[str, str], set[str]] = defaultdict(set)
    threads: dict[str, int] = {}
    for entry in entries:
        known[entry.workload_key] = entry.op
        have[(entry.target, entry.device_class)].add(entry.workload_key)
        threads[entry.workload_key] = min(threads.get(entry.workload_key, entry.threads),
                                          entry.threads)
    out = []
    for (target_name, device_class), devices in sorted(online.items()):
        for key, op in sorted(known.items()):
            current = template_for(op, target_name)
            if key in have[(target_name, device_class)] or current is None:
                continue
            out.append(StaleItem(
                workload=key, op=op, target=target_name, reason="missing",
                detail=f"no entry for device class {device_class} on {target_name!r}, which "
                       f"now has workers ({', '.join(sorted(devices))})",
                device_key=min(devices), current_template=current.name,
                current_version=int(current.version), device_class=device_class,
                threads=threads.get(key, 1)))
    return out


def _unserved_unknown(entries: list[TuningLogEntry], online: Online, now: dt.datetime,
                      cutoff: dt.datetime, last: dict[tuple[str, str, str], dt.datetime | None]
                      ) -> list[StaleItem]:
    """Stale entries of class ``unknown`` on targets without any online class: skipped."""
    served = {target_name for target_name, _class in online}
    out = []
    for entry in entries:
        if entry.device_class != UNKNOWN or entry.target in served:
            continue
        when = last.get((entry.workload_key, entry.target, UNKNOWN)) or _utc(entry.updated_at)
        item = _judge(entry, when, now, cutoff)
        if item is not None:
            out.append(dataclasses.replace(
                item, detail=f"{item.detail}; no online worker for target {entry.target!r}"))
    return out


def _online_classes(session: Session, heartbeat_s: float) -> Online:
    """(target, device class) -> device keys with a worker heard from recently."""
    rows = session.execute(
        select(Worker.target, Worker.device_key, Worker.hardware)
        .where(Worker.last_heartbeat >= utcnow_plus(-ONLINE_HEARTBEATS * heartbeat_s)))
    online: Online = defaultdict(set)
    for target_name, device_key, hardware in rows:
        online[(target_name, class_of_hardware(hardware) or UNKNOWN)].add(device_key)
    return dict(online)


def _last_measured(session: Session, target: str | None
                   ) -> dict[tuple[str, str, str], dt.datetime | None]:
    """(workload, target, device class) -> when its latest successful measurement finished."""
    device_class = func.coalesce(Measurement.device_class, UNKNOWN)
    query = (select(Measurement.workload_key, Measurement.target, device_class,
                    func.max(Measurement.finished_at))
             .where(Measurement.state == MeasurementState.DONE,
                    Measurement.error_kind == ErrorKind.NONE)
             .group_by(Measurement.workload_key, Measurement.target, device_class))
    if target:
        query = query.where(Measurement.target == target)
    return {(key, t, c): _utc(when) for key, t, c, when in session.execute(query)}


def _utc(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    if isinstance(value, str):  # SQLite hands back the raw text of an expression
        value = dt.datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
