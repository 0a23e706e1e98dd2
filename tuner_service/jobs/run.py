"""The in-memory driving state of one job: a tuner per task, rebuilt from the database.

A ``JobRun`` is only ever advanced inside a session by the process holding the job's driver
lease. If a step's transaction fails, the caller drops the run and rebuilds it from the
database, so tuner state never holds proposals that were not stored.

Learning is paced: a tuner's ``tell`` refits its model, which costs far more than proposing
from the model it has. Results wait per task until told, and one ``learn`` call tells tasks
(the longest-waiting first) only until its time budget is spent, so a job with many workers
refits each task on larger batches instead of falling behind. Under load the driver tops the
queue up before it learns (``jobs.driver``), so a claim never waits on a refit.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import Table, func, select, update
from sqlalchemy.orm import Session

from schedule_templates.records import MeasureResult
from schedule_templates.space import ConfigSpace
from schedule_templates.templates.base import template_by_name
from schedule_templates.workloads import parse_workload
from tuner_service.cost_model import PriorCache
from tuner_service.db.bulk import ids_in, insert_rows
from tuner_service.db.clock import utcnow
from tuner_service.db.models import Job, JobTask, Measurement, Task
from tuner_service.db.states import MEASUREMENT_PENDING, JobStatus, MeasurementState, TaskStatus
from tuner_service.jobs import confirm
from tuner_service.jobs.confirm import ConfirmPolicy
from tuner_service.jobs.device import DeviceQuery
from tuner_service.jobs.queue import serving_workers
from tuner_service.jobs.results import CONFIRM, measurement_result
from tuner_service.jobs.scheduler import TaskLoad, TaskScheduler, best_curve
from tuner_service.jobs.seeds import known_device, seed_configs, take_seeds
from tuner_service.jobs.transfer import transfer_records
from tuner_service.tuners import TRANSFER_TUNERS, Tuner, make_tuner

logger = logging.getLogger(__name__)

#: what ``observe`` reads of a finished candidate: enough to tell its tuner, no ORM objects
RESULT_COLUMNS = (Measurement.id, Measurement.state, Measurement.job_task_id,
                  Measurement.config_index, Measurement.costs, Measurement.error_kind,
                  Measurement.error_message, Measurement.compile_time_s,
                  Measurement.wall_time_s, Measurement.noisy, Measurement.load)


@dataclasses.dataclass
class TaskRun:
    job_task_id: int
    workload_key: str
    template: Any
    space: ConfigSpace
    tuner: Tuner
    budget: int
    done: int = 0
    pending: set[int] = dataclasses.field(default_factory=set)
    finished: bool = False
    exhausted: bool = False
    stalled: bool = False  # stopped early: no gain for the scheduler's window
    weight: float = 1.0
    flops: float = 0.0
    #: best latency after each measured trial (inf until one succeeded)
    curve: list[float] = dataclasses.field(default_factory=list)
    #: proposed before the tuner's own picks: the template default, the best known config
    seeds: list[int] = dataclasses.field(default_factory=list)
    #: re-measurements of the top candidates in flight (``jobs.confirm``)
    confirming: set[int] = dataclasses.field(default_factory=set)
    confirm_started: bool = False
    #: finished measurements not yet told to the tuner: (config indices, results)
    untold: tuple[list[int], list[MeasureResult]] = dataclasses.field(
        default_factory=lambda: ([], []))
    #: when the oldest untold result arrived (monotonic seconds), None when none waits
    untold_since: float | None = None

    def load(self) -> TaskLoad:
        stopped = self.finished or self.exhausted or self.stalled
        remaining = 0 if stopped else max(0, self.budget - self.done - len(self.pending))
        return TaskLoad(remaining, len(self.pending), self.weight, self.flops,
                        tuple(self.curve), self.template.name)


#: (task, config indices, their results) to tell a task's tuner
Observed = list[tuple[TaskRun, list[int], list[MeasureResult]]]


class JobRun:
    def __init__(self, job: Job, tasks: list[TaskRun], scheduler: TaskScheduler,
                 policy: ConfirmPolicy | None = None) -> None:
        self.job_id = job.id
        self.target = job.target
        self.device_key = job.device_key
        self.tasks = tasks
        self.scheduler = scheduler
        self.policy = policy or ConfirmPolicy()
        self._backlog: Observed = []
        #: finished measurements per second, smoothed (sizes the queue ahead of the workers)
        self.finish_rate = 0.0
        self._rate_at: float | None = None

    @classmethod
    def rebuild(cls, session: Session, job: Job, scheduler: TaskScheduler,
                policy: ConfirmPolicy | None = None) -> JobRun:
        """Recreate every task's tuner by replaying its recorded measurements."""
        rows = session.execute(
            select(JobTask, Task.workload_key, Task.weight, Task.flops)
            .join(Task, Task.id == JobTask.task_id)
            .where(JobTask.job_id == job.id, JobTask.template.is_not(None))
            .order_by(JobTask.id)
        ).all()
        run = cls(job, [], scheduler, policy)
        known = known_device(session, job)
        priors = PriorCache()  # tasks of one template share their transfer prior
        for jt, key, weight, flops in rows:
            task, measured = _rebuild_task(session, job, jt, key, known, priors)
            task.weight, task.flops = float(weight or 1), float(flops or 0)
            run.tasks.append(task)
            if measured:
                run._backlog.append(_observation(task, measured))
        logger.info("job %d: rebuilt %d task tuners", job.id, len(run.tasks))
        return run

    def observe(self, session: Session) -> Observed:
        """Read new results of in-flight candidates and the trial counts (no writes).

        Results found while rebuilding are returned first, so ``learn`` replays them."""
        observed, self._backlog = self._backlog, []
        by_id = {mid: t for t in self.tasks for mid in t.pending}
        done = session.execute(
            select(*RESULT_COLUMNS).where(ids_in(session, Measurement.id, list(by_id)),
                                          Measurement.state.not_in(MEASUREMENT_PENDING))
            .order_by(Measurement.id)
        ).all() if by_id else []
        grouped: dict[int, list[Any]] = defaultdict(list)
        for m in done:
            by_id[m.id].pending.discard(m.id)
            if m.state == MeasurementState.DONE:
                grouped[m.job_task_id or 0].append(m)
        self._count_finished(len(done))
        observed += [_observation(task, grouped[task.job_task_id]) for task in self.tasks
                     if grouped.get(task.job_task_id)]
        self._observe_confirmations(session)
        counts: dict[int, int] = dict(session.execute(
            select(JobTask.id, JobTask.trials_done).where(JobTask.job_id == self.job_id)
        ).all())
        for task in self.tasks:
            task.done = counts.get(task.job_task_id, task.done)
        return observed

    def _observe_confirmations(self, session: Session) -> None:
        confirming = {mid: t for t in self.tasks for mid in t.confirming}
        if not confirming:
            return
        for measure_id in session.scalars(select(Measurement.id).where(
                Measurement.id.in_(list(confirming)),
                Measurement.state.not_in(MEASUREMENT_PENDING))):
            confirming[measure_id].confirming.discard(measure_id)

    def _count_finished(self, count: int, horizon_s: float = 2.0) -> None:
        """Fold ``count`` results finished since the last observe into ``finish_rate``."""
        now = time.monotonic()
        if self._rate_at is not None and now > self._rate_at:
            elapsed = now - self._rate_at
            keep = math.exp(-elapsed / horizon_s)
            self.finish_rate = keep * self.finish_rate + (1 - keep) * count / elapsed
        self._rate_at = now

    @staticmethod
    def hold(observed: Observed) -> None:
        """Keep results until ``learn`` tells them; their configs are never proposed again,
        and the task's best-so-far curve (what the scheduler reads) includes them at once."""
        now = time.monotonic()
        for task, indices, results in observed:
            task.tuner.exclude(indices)
            task.curve += best_curve(task.curve[-1] if task.curve else math.inf,
                                     [r.mean_cost if r.ok else math.inf for r in results])
            task.untold[0].extend(indices)
            task.untold[1].extend(results)
            task.untold_since = task.untold_since if task.untold_since is not None else now

    def learn(self, observed: Observed, budget_s: float = math.inf) -> int:
        """Tell the tuners their results (``observed`` and those held), the longest-waiting
        task first, until ``budget_s`` seconds are spent (at least one task is told); the rest
        wait for the next call. Outside any transaction (a model fit is slow). Returns the
        tasks told."""
        self.hold(observed)
        now = time.monotonic()
        waiting = sorted((t for t in self.tasks if t.untold_since is not None),
                         key=lambda t: t.untold_since or 0.0)
        told = 0
        for task in waiting:
            if told and time.monotonic() - now >= budget_s:
                break
            (indices, results), task.untold, task.untold_since = task.untold, ([], []), None
            task.tuner.tell(indices, results)
            told += 1
        return told

    def propose(self, queue_depth: int, batch_size: int, demand: int = 0
                ) -> list[tuple[TaskRun, list[int]]]:
        """Ask the tuners the scheduler picks for new configs; empty answers mark exhaustion.

        ``queue_depth``: candidates in flight wanted in all; ``demand``: how many of them the
        workers are taking now. A task holds at most ``batch_size`` in flight, or its share of
        ``demand`` when that is more (many workers on few tasks)."""
        in_flight = sum(len(t.pending) for t in self.tasks)
        for task in self.tasks:
            if not (task.finished or task.stalled) and self.scheduler.should_stop(task.load()):
                task.stalled = True
                logger.info("job %d: task %s stopped early", self.job_id, task.workload_key)
        loads = [t.load() for t in self.tasks]
        active = sum(1 for load in loads if load.remaining > 0)
        if active and demand > 0:
            batch_size = max(batch_size, math.ceil(demand / active))
        proposals = []
        for position, n in self.scheduler.allocate(loads, queue_depth - in_flight, batch_size):
            task = self.tasks[position]
            indices = take_seeds(task, n)
            indices += task.tuner.ask(n - len(indices)) if n > len(indices) else []
            if indices:
                proposals.append((task, indices))
            else:
                task.exhausted = True
        return proposals

    def record(self, session: Session, proposals: list[tuple[TaskRun, list[int]]]) -> bool:
        """Queue the proposed candidates (one multi-row INSERT for all of them) and finish what
        is done; True when the job is done."""
        rows = [(task, self._measurement(task, i)) for task, indices in proposals
                for i in indices]
        if rows:
            ids = insert_rows(session, cast(Table, Measurement.__table__),
                              [values for _task, values in rows])
            for (task, _values), measure_id in zip(rows, ids, strict=True):
                task.pending.add(measure_id)
            started = sorted({task.job_task_id for task, _indices in proposals})
            session.execute(update(JobTask).where(JobTask.id.in_(started),
                                                  JobTask.status == TaskStatus.QUEUED)
                            .values(status=TaskStatus.RUNNING)
                            .execution_options(synchronize_session=False))
        self._withdraw_stalled(session)
        return self._finish(session)

    def _withdraw_stalled(self, session: Session) -> None:
        """A task that stopped early gives up its candidates still queued (the ones queued
        ahead for many workers); those already leased are measured and count."""
        stalled = [t for t in self.tasks if t.stalled and t.pending]
        if not stalled:
            return
        withdrawn = session.execute(
            update(Measurement)
            .where(Measurement.job_task_id.in_([t.job_task_id for t in stalled]),
                   Measurement.state == MeasurementState.QUEUED)
            .values(state=MeasurementState.CANCELLED)
            .returning(Measurement.id, Measurement.job_task_id)
            .execution_options(synchronize_session=False)).all()
        for task in stalled:
            task.pending.difference_update(m for m, t in withdrawn if t == task.job_task_id)

    def in_flight_count(self) -> int:
        """Candidates this run queued that have not finished (as of the last observe)."""
        return sum(len(t.pending) for t in self.tasks)

    def in_flight(self, session: Session) -> dict[str, int]:
        """The job's queued and leased candidates (one grouped count on an index)."""
        rows = session.execute(
            select(Measurement.state, func.count())
            .where(Measurement.job_task_id.in_([t.job_task_id for t in self.tasks]),
                   Measurement.state.in_(MEASUREMENT_PENDING))
            .group_by(Measurement.state)).all()
        return {str(state): int(count) for state, count in rows}

    def _finish_message(self, task: TaskRun) -> str:
        if task.done >= task.budget:
            return ""
        if task.exhausted:
            return "search space exhausted"
        return (f"stopped early after {task.done} trials: the best did not improve by "
                f"{self.scheduler.min_gain:.0%} in the last {self.scheduler.early_stop}")

    def _measurement(self, task: TaskRun, index: int) -> dict[str, Any]:
        return {
            "uid": uuid.uuid4().hex, "job_task_id": task.job_task_id, "config_index": index,
            "config": task.space.get(index).to_json(), "template": task.template.name,
            "template_version": int(task.template.version), "workload_key": task.workload_key,
            "target": self.target, "device_key": self.device_key, "state": MeasurementState.QUEUED,
            "attempts": 0, "error_message": "", "purpose": "tune",
        }

    def _finish(self, session: Session) -> bool:
        for task in self.tasks:
            if task.finished or task.pending or task.confirming:
                continue
            if task.done >= task.budget or task.exhausted or task.stalled:
                if not task.confirm_started:
                    task.confirm_started = True
                    task.confirming.update(confirm.start(session, task, self.target,
                                                         self.device_key, self.policy))
                    if task.confirming:
                        continue
                note = confirm.finish(session, task, self.job_id)
                task.finished = True
                message = "; ".join(filter(None, (self._finish_message(task), note)))
                session.execute(update(JobTask).where(JobTask.id == task.job_task_id)
                                .values(status=TaskStatus.DONE, message=message))
        if not all(t.finished for t in self.tasks):
            return False
        session.execute(update(Job).where(Job.id == self.job_id).values(
            status=JobStatus.DONE, finished_at=utcnow(), driver_owner=None, driver_expires_at=None))
        logger.info("job %d done", self.job_id)
        return True


def _observation(task: TaskRun, done: Sequence[Any]
                 ) -> tuple[TaskRun, list[int], list[MeasureResult]]:
    """``done``: measurements, or rows of ``RESULT_COLUMNS`` (the same attribute names)."""
    return task, [m.config_index for m in done], [measurement_result(m) for m in done]


def _rebuild_task(session: Session, job: Job, jt: JobTask, workload_key: str,
                  known: DeviceQuery | None, priors: PriorCache | None = None
                  ) -> tuple[TaskRun, list[Measurement]]:
    """A fresh tuner for one task, plus its finished measurements to replay with ``tell``."""
    template = template_by_name(jt.template or "")
    workload = parse_workload(workload_key)
    # GPU templates filter configs by the limits the job's workers reported (same indices)
    device = _reported_gpu(session, job) if template.target_kind == "cuda" else None
    space = template.space(workload, device)
    # xgb-transfer starts from the shared log: this template's measurements on other workloads
    transfer = (transfer_records(session, template, job.target, jt.id,
                                 device_class=known.device_class.id
                                 if known and known.device_class else None)
                if job.tuner in TRANSFER_TUNERS else [])
    tuner = make_tuner(job.tuner, workload, space, seed=(job.id << 20) ^ jt.id,
                       template=template, transfer=transfer, priors=priors)
    task = TaskRun(jt.id, workload_key, template, space, tuner, budget=jt.trials_budget,
                   done=jt.trials_done, finished=jt.status == TaskStatus.DONE)
    rows = session.scalars(
        select(Measurement).where(Measurement.job_task_id == jt.id).order_by(Measurement.id)
    ).all()
    measured = [m for m in rows if m.purpose != CONFIRM]
    rechecks = [m for m in rows if m.purpose == CONFIRM]
    task.confirm_started = bool(rechecks)
    task.confirming = {m.id for m in rechecks if m.state in MEASUREMENT_PENDING}
    task.seeds = seed_configs(session, template, workload, space, workload_key, job.target,
                              known)
    pending = [m for m in measured if m.state in MEASUREMENT_PENDING]
    task.pending = {m.id for m in pending}
    # in-flight and withdrawn configs must not be proposed again
    tuner.exclude(m.config_index for m in measured if m.state != MeasurementState.DONE)
    return task, [m for m in measured if m.state == MeasurementState.DONE]


def _reported_gpu(session: Session, job: Job) -> dict[str, Any] | None:
    """The ``gpu`` facts the latest worker serving the job (its device key and target, as
    ``Target.serves`` matches them: a ``cuda`` job is served by ``cuda -arch=sm_90``)
    registered with."""
    serving = serving_workers(session, job.target, job.device_key)
    hardware = serving[0].hardware if serving else {}
    gpu = hardware.get("gpu") if isinstance(hardware, dict) else None
    return gpu if isinstance(gpu, dict) else None
