"""Measurement records as JSON lines, so tuning logs move between deployments.

Export writes every finished measurement; import validates each line against its template's
space, stores all lines in one transaction (or none), skips records already present (by
``uid``) and folds good results into the shared tuning log.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import math
from collections.abc import Iterator
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from schedule_templates.errors import ScheduleError
from schedule_templates.protocol import Candidate
from schedule_templates.records import ErrorKind, MeasureResult
from tuner_service.db.models import Measurement
from tuner_service.db.states import MeasurementState
from tuner_service.db.types import bounded_utc
from tuner_service.db.values import check_tree
from tuner_service.errors import InvalidInputError
from tuner_service.jobs.results import measurement_result, update_tuning_log
from tuner_service.jobs.views import iso
from workers.device_class import UNKNOWN, DeviceClass

RECORD_VERSION = 1


def export_record(m: Measurement) -> dict[str, Any]:
    result = measurement_result(m).to_json()
    for key in ("compile_time_s", "wall_time_s"):  # rows stored before inputs were checked
        if not math.isfinite(result[key]):
            result[key] = 0.0
    peak = m.peak_gflops if m.peak_gflops is not None and math.isfinite(m.peak_gflops) else None
    return {
        "uid": m.uid, "workload": m.workload_key, "target": m.target, "template": m.template,
        "template_version": m.template_version, "config": m.config,
        "result": {**result, "peak_gflops": peak},
        "device_key": m.device_key, "timestamp": iso(m.finished_at),
        "device_class": m.device_class, "threads": m.threads, "purpose": m.purpose,
        "record_version": RECORD_VERSION,
    }


def export_lines(session: Session, workload: str | None, target: str | None,
                 since: dt.datetime | None) -> Iterator[str]:
    query = select(Measurement).where(Measurement.state == MeasurementState.DONE)
    if workload:
        query = query.where(Measurement.workload_key == workload)
    if target:
        query = query.where(Measurement.target == target)
    if since is not None:  # the column type compares in UTC on both databases
        query = query.where(Measurement.finished_at >= since)
    for m in session.scalars(query.order_by(Measurement.id).execution_options(yield_per=500)):
        yield json.dumps(export_record(m)) + "\n"


def import_lines(session: Session, text: str, max_lines: int) -> dict[str, Any]:
    """Validate every line first; any bad line rejects the whole import (422 lists them)."""
    parsed, errors = [], []
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if len(lines) > max_lines:
        raise InvalidInputError(f"too many records ({len(lines)} > {max_lines})")
    for number, line in lines:
        try:
            parsed.append(_parse_line(line))
        except (ValueError, TypeError, KeyError, ScheduleError) as e:
            errors.append({"line": number, "reason": str(e)[:500]})
    if errors:
        raise InvalidInputError({"message": "invalid records", "errors": errors[:100]})
    return _store(session, parsed)


def _parse_line(line: str) -> Measurement:
    record = json.loads(line)
    if not isinstance(record, dict):
        raise ValueError("a record must be a JSON object")
    result_json = record.get("result")
    if isinstance(result_json, dict) and isinstance(result_json.get("error_message"), str):
        # an error text is context: NUL (which PostgreSQL text cannot hold) is dropped
        result_json["error_message"] = result_json["error_message"].replace("\x00", "")
    check_tree(record, max_depth=16)  # finite numbers, clean text, bounded nesting
    template, workload = _text(record, "template", 128), _text(record, "workload", 512)
    version = record["template_version"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError(f"'template_version' must be an integer, not {version!r}")
    decoded = Candidate(template, workload, record["config"], version).decode()
    config = decoded.config
    result_json = record.get("result") or {}
    if not isinstance(result_json, dict):
        raise ValueError("'result' must be an object")
    result = _checked_result(MeasureResult.from_json(result_json))
    uid = str(record.get("uid") or hashlib.sha256(line.strip().encode()).hexdigest())
    if "\x00" in uid:  # PostgreSQL text cannot hold NUL
        raise ValueError("'uid' must not contain NUL")
    peak = result_json.get("peak_gflops")
    return Measurement(
        uid=uid[:64], job_task_id=None, config_index=config.index, config=config.to_json(),
        template=template, template_version=version,
        workload_key=decoded.workload.key, target=_text(record, "target", 255),
        device_key=_text(record, "device_key", 255) if record.get("device_key") else None,
        state=MeasurementState.DONE, attempts=0,
        costs=list(result.costs), mean_cost=result.mean_cost if result.ok else None,
        error_kind=int(result.error), error_message=result.error_message.replace("\x00", ""),
        compile_time_s=result.compile_time_s, wall_time_s=result.wall_time_s,
        peak_gflops=_finite(float(peak), "peak_gflops") if peak is not None else None,
        finished_at=_timestamp(record.get("timestamp")),
        device_class=_device_class(record.get("device_class")),
        threads=_threads(record.get("threads")),
    )


def _device_class(value: Any) -> str | None:
    """A record's device class id (None: recorded before classes, or ``unknown``)."""
    if value is None or value == UNKNOWN:
        return None
    if not isinstance(value, str):
        raise ValueError(f"'device_class' must be a string, not {value!r}")
    return DeviceClass.parse(value).id  # DeviceClassError is a ValueError


def _threads(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
        raise ValueError(f"'threads' must be a whole number from 1 to 4096, not {value!r}")
    return value


def _text(record: dict[str, Any], key: str, limit: int) -> str:
    value = record[key]
    if not isinstance(value, str) or not value or len(value) > limit or "\x00" in value:
        raise ValueError(f"'{key}' must be a non-empty string of at most {limit} characters "
                         "without NUL")
    return value


def _finite(value: float, what: str) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, not {value}")
    return value


def _checked_result(result: MeasureResult) -> MeasureResult:
    """The result with finite numbers only; a failed one keeps no costs (they mean nothing)."""
    if result.error is not ErrorKind.NONE and result.costs:
        result = dataclasses.replace(result, costs=())
    for value in (*result.costs, result.compile_time_s, result.wall_time_s):
        _finite(value, "costs and times")
    if result.error is ErrorKind.NONE and (not result.costs or min(result.costs) <= 0):
        raise ValueError("a result without error needs positive costs")
    return result


def _timestamp(value: Any) -> dt.datetime | None:
    if value in (None, ""):
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return bounded_utc(dt.datetime.fromtimestamp(float(value), dt.UTC))
        except (OverflowError, OSError) as e:
            raise ValueError(f"timestamp {value} is out of range") from e
    if not isinstance(value, str):
        raise ValueError(f"'timestamp' must be ISO 8601 text or seconds, not {value!r}")
    return bounded_utc(dt.datetime.fromisoformat(value))


def _store(session: Session, records: list[Measurement]) -> dict[str, Any]:
    uids = [r.uid for r in records]
    known: set[str] = set()
    for start in range(0, len(uids), 500):
        chunk = uids[start:start + 500]
        known.update(session.scalars(select(Measurement.uid).where(Measurement.uid.in_(chunk))))
    fresh, seen = [], set()
    for r in records:
        if r.uid in known or r.uid in seen:
            continue
        seen.add(r.uid)
        fresh.append(r)
    session.add_all(fresh)
    session.flush()
    for r in fresh:
        if r.mean_cost is not None:
            update_tuning_log(session, r, job_id=None)
    return {"imported": len(fresh), "duplicates": len(records) - len(fresh)}
