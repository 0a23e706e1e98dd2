"""Which shared-log entries a refresh should tune again, and why.

An entry (best config per workload and target) is stale when

* ``template``: it was measured with another template, or an older version of the template
  that now serves its operator on its target (old numbers are not comparable);
* ``age``: no successful measurement of its (workload, target) finished within the window. A
  re-measurement that did not beat the stored best still counts as fresh, so a refresh that
  confirms an entry is not repeated the next night;
* ``missing``: a target that has online workers has no entry for a workload the log knows
  from another target, and a template exists for it there.

Entries that no online worker can measure are reported as ``skipped`` (with the reason), not
as work: a job for them would wait forever.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tuner_service.db.clock import utcnow, utcnow_plus
from tuner_service.db.models import Measurement, TuningLogEntry, Worker
from tuner_service.jobs.templates import template_for

#: a worker is online when heard from within this many heartbeat periods (as GET /workers)
ONLINE_HEARTBEATS = 3
REASONS = ("template", "age", "missing")


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
    online = _online_devices(session, heartbeat_s)
    last = _last_measured(session, target)
    items, skipped = [], []
    for entry in entries:
        when = last.get((entry.workload_key, entry.target)) or _utc(entry.updated_at)
        item = _judge(entry, when, now, cutoff)
        if item is None:
            continue
        devices = online.get(entry.target, set())
        if item.current_template is None:
            skipped.append(item)
        elif not devices:
            skipped.append(dataclasses.replace(
                item, detail=f"{item.detail}; no online worker for target {entry.target!r}"))
        else:
            keep = entry.device_key if entry.device_key in devices else None
            items.append(dataclasses.replace(item, device_key=keep))
    wanted = {t: d for t, d in online.items() if not target or t == target}
    items.extend(_missing(session, wanted))
    items.sort(key=lambda i: (REASONS.index(i.reason), i.target, i.workload))
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
        last_measured_at=when, gflops=entry.gflops)
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


def _missing(session: Session, online: dict[str, set[str]]) -> list[StaleItem]:
    """Workloads the log knows (on any target) without an entry on a target that has workers."""
    if not online:
        return []
    known: dict[str, str] = {}
    have: dict[str, set[str]] = defaultdict(set)
    for key, op, entry_target in session.execute(
            select(TuningLogEntry.workload_key, TuningLogEntry.op, TuningLogEntry.target)):
        known[key] = op
        have[entry_target].add(key)
    out = []
    for target_name, devices in sorted(online.items()):
        for key, op in sorted(known.items()):
            current = template_for(op, target_name)
            if key in have[target_name] or current is None:
                continue
            out.append(StaleItem(
                workload=key, op=op, target=target_name, reason="missing",
                detail=f"no entry on {target_name!r}, which now has workers "
                       f"({', '.join(sorted(devices))})",
                device_key=next(iter(devices)) if len(devices) == 1 else None,
                current_template=current.name, current_version=int(current.version)))
    return out


def _online_devices(session: Session, heartbeat_s: float) -> dict[str, set[str]]:
    """target -> device keys with a worker heard from recently."""
    rows = session.execute(
        select(Worker.target, Worker.device_key).distinct()
        .where(Worker.last_heartbeat >= utcnow_plus(-ONLINE_HEARTBEATS * heartbeat_s)))
    online: dict[str, set[str]] = defaultdict(set)
    for target_name, device_key in rows:
        online[target_name].add(device_key)
    return dict(online)


def _last_measured(session: Session, target: str | None
                   ) -> dict[tuple[str, str], dt.datetime | None]:
    """(workload, target) -> when its latest successful measurement finished."""
    query = (select(Measurement.workload_key, Measurement.target,
                    func.max(Measurement.finished_at))
             .where(Measurement.state == "done", Measurement.error_kind == 0)
             .group_by(Measurement.workload_key, Measurement.target))
    if target:
        query = query.where(Measurement.target == target)
    return {(key, t): _utc(when) for key, t, when in session.execute(query)}


def _utc(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    if isinstance(value, str):  # SQLite hands back the raw text of an expression
        value = dt.datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
