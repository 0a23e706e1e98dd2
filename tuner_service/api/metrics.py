"""Prometheus metrics at ``GET /metrics`` (text exposition format).

Two kinds of numbers:

* counters kept by this process: ``tuner_measurement_results_total{error}`` counts results
  stored by this server (``rate()`` of it is measurements per second; the ``error`` label gives
  errors by kind). Counted when the storing transaction commits, so a retried or aborted
  transaction counts nothing. Each API replica counts its own: sum them in queries.
* gauges read from the shared database at scrape time with a few grouped queries on indexed
  columns: queue depth (queued and leased measurements per target and device), workers online,
  jobs by status, and each worker's median time per candidate by part (wait, claim, build,
  check, measure, report; over its results of the last ``TIMING_WINDOW_S``). Every replica
  reports the same values: use ``max()`` across replicas.

One registry per app (no global state), so several apps in one process (tests) never mix.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

from schedule_templates.records import ErrorKind
from tuner_service.api.deps import Reader
from tuner_service.db.clock import utcnow_plus
from tuner_service.db.engine import Database
from tuner_service.db.models import Job, Measurement, Worker
from tuner_service.db.states import MEASUREMENT_PENDING, JobStatus
from tuner_service.errors import TunerServiceError
from tuner_service.jobs.results import STORED_RESULTS_INFO
from tuner_service.jobs.timings import timing_medians

logger = logging.getLogger(__name__)

#: a worker is online when it was heard from within this many heartbeat periods (as the API's
#: worker list counts it)
ONLINE_HEARTBEATS = 3
#: the window of the time-split medians (as the dashboard's workers view)
TIMING_WINDOW_S = 300.0


def error_label(kind: int) -> str:
    try:
        return ErrorKind(kind).name.lower()
    except ValueError:
        return "unknown"


class DatabaseCollector(Collector):
    """Gauges computed from the database on every scrape."""

    def __init__(self, db: Database, heartbeat_s: float) -> None:
        self._db = db
        self._online_s = ONLINE_HEARTBEATS * heartbeat_s

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("tuner_database_up",
                               "1 when the last scrape could read the database")
        try:
            with self._db.read_session() as session:  # a scrape never takes the write lock
                families = [self._queue(session), self._workers(session), self._jobs(session),
                            self._timings(session)]
        except TunerServiceError as e:
            logger.warning("metrics: database unavailable: %s", e)
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        yield from families

    def _queue(self, session: Session) -> Metric:
        family = GaugeMetricFamily(
            "tuner_queue_measurements", "Measurements waiting (queued) or being measured "
            "(leased), per target and device key", labels=["state", "target", "device_key"])
        rows = session.execute(
            select(Measurement.state, Measurement.target, Measurement.device_key, func.count())
            .where(Measurement.state.in_(MEASUREMENT_PENDING))
            .group_by(Measurement.state, Measurement.target, Measurement.device_key)).all()
        seen = set()
        for state, target, device_key, count in rows:
            family.add_metric([state, target, device_key or ""], float(count))
            seen.add(state)
        for state in MEASUREMENT_PENDING:  # so a sum over an empty queue is 0, not "no data"
            if state not in seen:
                family.add_metric([state, "", ""], 0.0)
        return family

    def _workers(self, session: Session) -> Metric:
        family = GaugeMetricFamily(
            "tuner_workers_online", "Workers heard from within "
            f"{ONLINE_HEARTBEATS} heartbeat periods, per device key and target",
            labels=["device_key", "target"])
        rows = session.execute(
            select(Worker.device_key, Worker.target, func.count())
            .where(Worker.last_heartbeat >= utcnow_plus(-self._online_s))
            .group_by(Worker.device_key, Worker.target)).all()
        for device_key, target, count in rows:
            family.add_metric([device_key, target], float(count))
        if not rows:
            family.add_metric(["", ""], 0.0)
        return family

    def _timings(self, session: Session) -> Metric:
        family = GaugeMetricFamily(
            "tuner_worker_time_per_candidate_seconds", "Median seconds per candidate a worker "
            f"spent in each part of its pipeline, over its results of the last "
            f"{TIMING_WINDOW_S:.0f} s", labels=["worker_id", "part"])
        for worker_id, medians in sorted(timing_medians(session, TIMING_WINDOW_S).items()):
            for part, seconds in medians.items():
                family.add_metric([str(worker_id), part.removesuffix("_s")], seconds)
        return family

    def _jobs(self, session: Session) -> Metric:
        family = GaugeMetricFamily("tuner_jobs", "Jobs per status", labels=["status"])
        counts = {status: count for status, count in session.execute(
            select(Job.status, func.count()).group_by(Job.status))}
        for status in sorted(set(JobStatus) | set(counts)):
            family.add_metric([status], float(counts.get(status, 0)))
        return family


class ServiceMetrics:
    """The registry of one app: the result counter, the database gauges, process metrics."""

    def __init__(self, db: Database, heartbeat_s: float) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.results = Counter(
            "tuner_measurement_results", "Measurement results stored by this server, by error "
            "kind ('none' is a successful measurement)", ["error"], registry=self.registry)
        for kind in ErrorKind:  # every series exists from the start, so rate() sees zeros
            self.results.labels(error=error_label(kind))
        self.registry.register(DatabaseCollector(db, heartbeat_s))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self._factory: Any = db.session_factory  # sessions of this app's database only
        event.listen(self._factory, "after_commit", self._after_commit)
        event.listen(self._factory, "after_soft_rollback", self._after_rollback)

    def _after_commit(self, session: Session) -> None:
        for kind in session.info.pop(STORED_RESULTS_INFO, ()):
            self.results.labels(error=error_label(kind)).inc()

    def _after_rollback(self, session: Session, _previous: Any) -> None:
        session.info.pop(STORED_RESULTS_INFO, None)

    def close(self) -> None:
        event.remove(self._factory, "after_commit", self._after_commit)
        event.remove(self._factory, "after_soft_rollback", self._after_rollback)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def get_metrics(request: Request) -> ServiceMetrics:
    metrics: ServiceMetrics = request.app.state.metrics
    return metrics


router = APIRouter(tags=["operations"])


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
def get_prometheus_metrics(
    _reader: Reader,
    metrics: Annotated[ServiceMetrics, Depends(get_metrics)],
) -> Response:
    """Prometheus text format: results stored, queue depth, workers online, jobs by status."""
    return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)


def install_metrics(app: FastAPI) -> None:
    """Counters for ``app.state.db`` and the ``/metrics`` route (outside the API prefix)."""
    app.state.metrics = ServiceMetrics(app.state.db, app.state.settings.heartbeat_s)
    app.include_router(router)
