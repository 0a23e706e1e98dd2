"""The job driver: a background thread in the server that keeps each job's queue topped up.

Only the process holding a job's driver lease (a row lease on the database clock, renewed every
step) drives it, so several server processes can share one database. The strategy lives in the
tuners and the task scheduler; this loop only leases, records and hands out.

Candidates are proposed ahead of the workers: a job keeps in flight what its live workers hold
plus ``queue_ahead_s`` seconds of work at the rate its results arrive, and in all at least one
claim of each live worker (its latest claim's size, ``note_claim``: known at once, while the
rate of results takes seconds to grow when many workers arrive together). When fewer than half of
those are still queued, a step queues new candidates from the models the tuners have *before*
it refits them on the new results, so claims keep finding work while a refit runs; refits are
paced (``JobRun.learn``) so one step never spends more than ``LEARN_BUDGET_S`` on them.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import threading
import time
import uuid

from sqlalchemy import or_, update
from sqlalchemy.orm import Session

from schedule_templates.errors import ScheduleError
from tuner_service.db.clock import utcnow, utcnow_plus
from tuner_service.db.engine import Database
from tuner_service.db.errors import DatabaseError
from tuner_service.db.models import Job
from tuner_service.db.states import JOB_ACTIVE, JobStatus, MeasurementState
from tuner_service.errors import TunerServiceError
from tuner_service.jobs.confirm import ConfirmPolicy
from tuner_service.jobs.queue import live_worker_ids, requeue_expired
from tuner_service.jobs.run import JobRun, Observed
from tuner_service.jobs.scheduler import make_scheduler
from tuner_service.settings import Settings

logger = logging.getLogger(__name__)

#: seconds of model refits one job's step may spend; the rest wait for the next step
LEARN_BUDGET_S = 0.5
#: most candidates one job's step queues: a step stays short, so the next one (which reads
#: what was measured meanwhile) comes soon; a deeper target fills over a few steps
MAX_QUEUED_PER_STEP = 2048
#: least pause between steps: a burst of wake-ups (every report wakes the driver) must not
#: turn the driver into a busy loop that starves the request threads
MIN_STEP_GAP_S = 0.02


@dataclasses.dataclass(frozen=True)
class Depth:
    """How many candidates a job should have in flight, and how many it has queued."""

    target: int
    #: candidates the workers are taking now (their leases plus the queue-ahead)
    demand: int
    queued: int

    @property
    def starving(self) -> bool:
        """Fewer queued than half the queue-ahead: refill before refitting."""
        return self.demand > 0 and self.queued * 2 < self.demand


def new_owner_id() -> str:
    return f"{socket.gethostname()[:32]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class JobDriver:
    def __init__(self, db: Database, settings: Settings, owner: str | None = None) -> None:
        self.db = db
        self.settings = settings
        self.owner = owner or new_owner_id()
        self._runs: dict[int, JobRun] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        #: worker id -> (items its latest claim to this process asked for, when: monotonic s)
        self._asked: dict[int, tuple[int, float]] = {}
        self._asked_lock = threading.Lock()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="job-driver", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._release_all()

    def wake(self) -> None:
        """Run a step soon (new results or a new job arrived)."""
        self._wake.set()

    def note_claim(self, worker_id: int, asked: int, got: int) -> None:
        """A worker's claim asked for ``asked`` items and got ``got``: its jobs keep that many
        in flight for it, and a short answer refills the queue now."""
        with self._asked_lock:
            self._asked[worker_id] = (asked, time.monotonic())
        if got < asked:
            self.wake()

    def _loop(self) -> None:
        logger.info("job driver %s started", self.owner)
        while not self._stop.is_set():
            try:
                self.step()
            except DatabaseError as e:
                logger.warning("job driver: %s; retrying", e)
                self._runs.clear()
            except Exception:
                logger.exception("job driver step failed")
                self._runs.clear()
            self._stop.wait(min(MIN_STEP_GAP_S, self.settings.driver_interval_s))
            self._wake.wait(self.settings.driver_interval_s)
            self._wake.clear()

    def step(self) -> None:
        """One pass: return expired leases, renew/take job leases, advance every owned job."""
        with self.db.session() as session:
            requeue_expired(session, self.settings.max_attempts)
        owned = self._acquire()
        self._forget_claims(time.monotonic() - self.settings.lease_s)
        for job_id in set(self._runs) - owned:
            logger.info("job %d: no longer driven by %s", job_id, self.owner)
            self._runs.pop(job_id, None)
        for job_id in sorted(owned):
            self._drive(job_id)

    def _forget_claims(self, before: float) -> None:
        """Workers that have not claimed here since ``before`` no longer size the queues."""
        with self._asked_lock:
            for worker_id in [w for w, (_n, at) in self._asked.items() if at < before]:
                del self._asked[worker_id]

    def _acquire(self) -> set[int]:
        lease = (Job.driver_owner.is_(None), Job.driver_owner == self.owner,
                 Job.driver_expires_at < utcnow())
        with self.db.session() as session:
            owned = set(session.scalars(
                update(Job).where(Job.status.in_(JOB_ACTIVE), or_(*lease))
                .values(driver_owner=self.owner,
                        driver_expires_at=utcnow_plus(self.settings.driver_lease_s))
                .returning(Job.id).execution_options(synchronize_session=False)
            ).all())
            if owned:
                session.execute(update(Job).where(Job.id.in_(owned), Job.status == JobStatus.QUEUED)
                                .values(status=JobStatus.RUNNING, started_at=utcnow())
                                .execution_options(synchronize_session=False))
        return owned

    def _drive(self, job_id: int) -> None:
        """Read results (one transaction), learn and propose (none), record (another); when
        the queue runs low, propose and record first and learn after."""
        try:
            run, observed, depth = self._observe(job_id)
            if run is None:
                return
            run.hold(observed)
            if not depth.starving:
                run.learn([], LEARN_BUDGET_S)
            proposals = run.propose(min(depth.target, run.in_flight_count() + MAX_QUEUED_PER_STEP),
                                    self.settings.batch_size, depth.demand)
            with self.db.session() as session:
                if self._locked_job(session, job_id) is None:
                    return
                finished = run.record(session, proposals)
            if finished:
                self._runs.pop(job_id, None)
            elif depth.starving:
                run.learn([], LEARN_BUDGET_S)
        except DatabaseError:
            self._runs.pop(job_id, None)  # rebuilt from what was committed
            raise
        except (ScheduleError, TunerServiceError, ValueError) as e:
            self._fail(job_id, str(e))
        except Exception as e:
            self._runs.pop(job_id, None)
            logger.exception("job %d: driver bug", job_id)
            self._fail(job_id, f"internal error: {type(e).__name__}: {e}")

    def _observe(self, job_id: int) -> tuple[JobRun | None, Observed, Depth]:
        """The job's run with its new results, and how many candidates it may have in flight."""
        with self.db.session() as session:
            job = self._locked_job(session, job_id)
            if job is None:
                return None, [], Depth(0, 0, 0)
            run = self._runs.get(job_id)
            if run is None:
                scheduler = make_scheduler(self.settings.task_scheduler,
                                           self.settings.early_stop, seed=job_id)
                policy = ConfirmPolicy(self.settings.confirm_top, self.settings.confirm_rounds)
                run = JobRun.rebuild(session, job, scheduler, policy)
                self._runs[job_id] = run
            observed = run.observe(session)
            return run, observed, self._queue_depth(session, job, run)

    def _queue_depth(self, session: Session, job: Job, run: JobRun) -> Depth:
        """At least ``queue_depth``; more for more live workers (``queue_per_worker`` each, or
        the sizes of their latest claims here when more); and what the workers lease plus
        ``queue_ahead_s`` of work at the rate results arrive. Not their sum: a queue deeper
        than the workers take hands out candidates after their task stopped early (a step
        late; tests/server/test_scheduler_driver.py bounds that to one claim)."""
        settings = self.settings
        flight = run.in_flight(session)
        ahead = math.ceil(run.finish_rate * settings.queue_ahead_s)
        demand = flight.get(MeasurementState.LEASED, 0) + ahead if ahead else 0
        if settings.queue_per_worker:
            live = live_worker_ids(session, job.target, job.device_key, settings.lease_s)
            with self._asked_lock:
                asked = sum(self._asked.get(w, (0, 0.0))[0] for w in live)
            demand = max(demand, settings.queue_per_worker * len(live), asked)
        queued = flight.get(MeasurementState.QUEUED, 0)
        return Depth(max(settings.queue_depth, demand), demand, queued)

    def _locked_job(self, session: Session, job_id: int) -> Job | None:
        """The job if this driver still holds it. The row lock orders a driver write with a
        concurrent cancel (PostgreSQL; SQLite serializes writers anyway)."""
        job = session.get(Job, job_id, with_for_update=True)
        if job is None or job.status not in JOB_ACTIVE or job.driver_owner != self.owner:
            self._runs.pop(job_id, None)
            return None
        return job

    def _fail(self, job_id: int, message: str) -> None:
        logger.warning("job %d failed: %s", job_id, message)
        self._runs.pop(job_id, None)
        with self.db.session() as session:
            session.execute(update(Job).where(Job.id == job_id).values(
                status=JobStatus.FAILED, message=message[:2000], finished_at=utcnow(),
                driver_owner=None, driver_expires_at=None))

    def _release_all(self) -> None:
        """Let another server take over at once instead of waiting for the lease to expire."""
        try:
            with self.db.session() as session:
                session.execute(update(Job).where(Job.driver_owner == self.owner)
                                .values(driver_owner=None, driver_expires_at=None))
        except TunerServiceError as e:
            logger.warning("could not release job leases: %s", e)
        self._runs.clear()
