"""Pre-tuned packs (TVM's TopHub): the best configs of one device class, as one JSON document.

A pack is shaped like a ``tuner fetch`` document (configs under ``tasks``, the thread count
under ``threads``), so ``tuner build --configs pack.json`` and every other config reader take it
as is; ``format``, ``version`` and ``device_class`` say what it is. Two kinds are served:

* an export (``resolve`` off): the entries stored for exactly that class, to carry to another
  deployment (``tuner log import``);
* a resolved pack (``resolve`` on): for every workload the log knows on the target, the entry a
  lookup for that class and thread count finds (exact, same microarchitecture, same ISA level;
  ``match`` on each), which is what a build on that device should use.

Importing validates every entry against its template's space and stores them all or none; an
entry replaces a stored one only if it is newer (template version) or faster, as results do.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from schedule_templates.errors import ScheduleError
from schedule_templates.protocol import Candidate
from tuner_service.db.models import TuningLogEntry
from tuner_service.errors import InvalidInputError
from tuner_service.jobs import device
from tuner_service.jobs.log import entry_json
from tuner_service.jobs.results import upsert_entry

PACK_FORMAT = "tuner-pack"
PACK_VERSION = 1
MAX_ENTRIES = 100_000


def export_pack(session: Session, device_class: str, target: str | None = None,
                threads: int | None = None, resolve: bool = False) -> dict[str, Any]:
    """The pack of ``device_class`` (exact entries, or resolved per workload)."""
    query = device.DeviceQuery.parse(device_class, threads)
    if resolve:
        if target is None:
            raise InvalidInputError("a resolved pack needs a target")
        tasks = _resolved(session, target, query)
    else:
        rows = select(TuningLogEntry).where(TuningLogEntry.device_class == device_class)
        if target:
            rows = rows.where(TuningLogEntry.target == target)
        if threads is not None:
            rows = rows.where(TuningLogEntry.threads == threads)
        tasks = [{**entry_json(e), "match": device.Match.EXACT.value} for e in session.scalars(
            rows.order_by(TuningLogEntry.target, TuningLogEntry.workload_key,
                          TuningLogEntry.threads))]
    return {"format": PACK_FORMAT, "version": PACK_VERSION, "device_class": device_class,
            "threads": threads, "target": target, "resolved": resolve,
            "created_at": dt.datetime.now(dt.UTC).isoformat(), "tasks": tasks}


def _resolved(session: Session, target: str, query: device.DeviceQuery) -> list[dict[str, Any]]:
    entries = list(session.scalars(select(TuningLogEntry).where(TuningLogEntry.target == target)))
    by_key: dict[str, list[TuningLogEntry]] = {}
    for entry in entries:
        by_key.setdefault(entry.workload_key, []).append(entry)
    out = []
    for key in sorted(by_key):
        found = device.pick(by_key[key], query, key)
        if found is not None:
            entry, level = found
            out.append({**entry_json(entry), "match": level.value})
    return out


def import_pack(session: Session, pack: Any) -> dict[str, Any]:
    """Validate every entry, then store them all; 422 lists the bad ones."""
    tasks = _tasks(pack)
    rows, errors = [], []
    for position, item in enumerate(tasks):
        try:
            rows.append(_entry(item))
        except (ValueError, TypeError, KeyError, ScheduleError, InvalidInputError) as e:
            errors.append({"entry": position, "reason": str(e)[:500]})
    if errors:
        raise InvalidInputError({"message": "invalid pack entries", "errors": errors[:100]})
    for row in rows:
        upsert_entry(session, row)
    return {"imported": len(rows), "device_classes": sorted({r["device_class"] for r in rows})}


def _tasks(pack: Any) -> list[Any]:
    if not isinstance(pack, dict) or pack.get("format") != PACK_FORMAT:
        raise InvalidInputError(f"not a pack: expected an object with format {PACK_FORMAT!r}")
    if pack.get("version") != PACK_VERSION:
        raise InvalidInputError(f"pack version {pack.get('version')!r} is not supported "
                                f"(this server reads version {PACK_VERSION})")
    tasks = pack.get("tasks")
    if not isinstance(tasks, list):
        raise InvalidInputError("a pack lists its configs under 'tasks'")
    if len(tasks) > MAX_ENTRIES:
        raise InvalidInputError(f"too many pack entries ({len(tasks)} > {MAX_ENTRIES})")
    return tasks


def _entry(item: Any) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise ValueError("an entry must be an object")
    version = item["template_version"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError(f"'template_version' must be an integer, not {version!r}")
    template, workload = _text(item, "template", 128), _text(item, "workload", 512)
    decoded = Candidate(template, workload, item["config"], version).decode()
    config, parsed = decoded.config, decoded.workload
    klass = device.parse_class(_text(item, "device_class", 255))
    threads = item.get("threads", 1)
    if not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= 4096:
        raise ValueError(f"'threads' must be a whole number from 1 to 4096, not {threads!r}")
    cost = item["mean_cost"]
    if isinstance(cost, bool) or not isinstance(cost, int | float) or not (
            math.isfinite(cost) and cost > 0):
        raise ValueError(f"'mean_cost' must be a positive number of seconds, not {cost!r}")
    spread = item.get("spread")
    if spread is not None and (isinstance(spread, bool) or not isinstance(spread, int | float)
                               or not math.isfinite(spread) or spread < 0):
        raise ValueError(f"'spread' must be a non-negative number, not {spread!r}")
    return {
        "workload_key": parsed.key, "op": parsed.op, "target": _text(item, "target", 255),
        "template": template, "template_version": version, "config": config.to_json(),
        "mean_cost": float(cost), "gflops": parsed.flops() / float(cost) / 1e9,
        "measurement_id": None, "job_id": None, "device_key": None,
        **device.class_columns(klass.id), "threads": threads,
        "spread": None if spread is None else float(spread),
        "confirmed": bool(item.get("confirmed", False)),
    }


def _text(item: dict[str, Any], key: str, limit: int) -> str:
    value = item[key]
    if not isinstance(value, str) or not value or len(value) > limit or "\x00" in value:
        raise ValueError(f"'{key}' must be a non-empty string of at most {limit} characters")
    return value
