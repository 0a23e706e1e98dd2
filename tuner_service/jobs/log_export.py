"""The shared tuning log as AutoTVM-style JSON lines (one best record per workload and target).

Entries that came from a measurement are written from that measurement (its costs and
timestamp); entries without one (an older deployment's data) from the entry itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuner_service.db.models import Measurement, TuningLogEntry
from tuner_service.jobs.views import AUTOTVM_LOG_VERSION, autotvm_record, epoch

_CHUNK = 500


def autotvm_log_lines(session: Session, target: str | None = None, op: str | None = None
                      ) -> Iterator[str]:
    query = select(TuningLogEntry).order_by(TuningLogEntry.op, TuningLogEntry.workload_key,
                                            TuningLogEntry.target)
    if target:
        query = query.where(TuningLogEntry.target == target)
    if op:
        query = query.where(TuningLogEntry.op == op)
    entries = list(session.scalars(query))
    for start in range(0, len(entries), _CHUNK):
        chunk = entries[start:start + _CHUNK]
        ids = [e.measurement_id for e in chunk if e.measurement_id is not None]
        found = {m.id: m for m in session.scalars(
            select(Measurement).where(Measurement.id.in_(ids)))} if ids else {}
        for entry in chunk:
            m = found.get(entry.measurement_id) if entry.measurement_id is not None else None
            # the measurement must still be the one the entry describes
            if m is not None and m.workload_key == entry.workload_key and m.target == entry.target:
                record = autotvm_record(m)
            else:
                record = entry_record(entry)
            yield json.dumps(record) + "\n"


def entry_record(entry: TuningLogEntry) -> dict[str, Any]:
    config = entry.config or {}
    return {
        "input": [entry.target, entry.template, [entry.workload_key], {}],
        "config": {"index": config.get("index"), "code_hash": None,
                   "entity": config.get("entity", [])},
        "result": [[entry.mean_cost], 0, 0.0, epoch(entry.updated_at)],
        "version": AUTOTVM_LOG_VERSION,
        "tvm_version": "0.x-compatible",
    }
