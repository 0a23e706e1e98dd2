"""Where workers' time per candidate goes: the medians of the parts their results carry.

Each result a worker reports may carry its time split (``reports.TIMING_PARTS``: waiting for
work, claiming, building, checking, measuring, reporting). The median per worker over recent
results shows which part bounds its throughput; the dashboard's workers view and ``/metrics``
read them from here.
"""

from __future__ import annotations

import statistics

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuner_service.db.clock import utcnow_plus
from tuner_service.db.models import Measurement
from tuner_service.jobs.reports import TIMING_PARTS

#: newest results one read looks at, at most (bounds a dashboard refresh or a scrape)
MAX_TIMED = 20_000


def timing_medians(session: Session, window_s: float,
                   limit: int = MAX_TIMED) -> dict[int, dict[str, float]]:
    """Per worker, the median seconds of each part of its time per candidate (wait, claim,
    build, check, measure, report) over its results of the last ``window_s``; parts it never
    reported are absent. One statement, on at most ``limit`` of the newest results."""
    rows = session.execute(
        select(Measurement.worker_id, Measurement.timings)
        .where(Measurement.finished_at >= utcnow_plus(-window_s),
               Measurement.worker_id.is_not(None), Measurement.timings.is_not(None))
        .order_by(Measurement.finished_at.desc()).limit(limit)).all()
    parts: dict[int, dict[str, list[float]]] = {}
    for worker_id, timings in rows:
        if not isinstance(timings, dict):
            continue
        mine = parts.setdefault(int(worker_id), {})
        for part in TIMING_PARTS:
            value = timings.get(part)
            if isinstance(value, int | float) and not isinstance(value, bool):
                mine.setdefault(part, []).append(float(value))
    return {worker: {part: statistics.median(values) for part, values in mine.items()}
            for worker, mine in parts.items()}
