"""Creating a job: its tasks (from a model or a workload list), templates and budgets."""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.protocol import Target
from schedule_templates.workloads import Workload, parse_workload
from tuner_service.db.clock import utcnow
from tuner_service.db.models import Job, JobTask, Measurement, Model, Task
from tuner_service.db.states import JOB_FINAL, JobStatus, MeasurementState, TaskStatus
from tuner_service.errors import InvalidInputError, NotFoundError
from tuner_service.jobs.budget import ResourceBudget
from tuner_service.jobs.templates import template_for

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class JobSpec:
    target: str = "llvm"
    trials_per_task: int = 64
    tuner: str = "random"
    model_id: int | None = None
    workloads: tuple[str, ...] = ()
    device_key: str | None = None
    threads: int | None = None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the token that created the job (it may cancel it); None for jobs made in-process
    owner_token_id: int | None = None


def create_job(session: Session, spec: JobSpec, budget: ResourceBudget | None = None) -> Job:
    """Store a job and its tasks; with ``budget``, refuse one that asks more of a worker."""
    _check_spec(spec)
    if budget is not None:
        budget.check_options(spec.options)
    tasks = _model_tasks(session, spec.model_id) if spec.model_id else _workload_tasks(
        session, spec.workloads)
    if budget is not None:
        budget.check_workloads(_parsed(tasks))
    # stored as parsed: claims match it against workers' targets (``Target.served``)
    job = Job(model_id=spec.model_id, target=str(Target.parse(spec.target)),
              device_key=spec.device_key,
              trials_per_task=spec.trials_per_task, tuner=spec.tuner, options=spec.options,
              threads=spec.threads, status=JobStatus.QUEUED, message="",
              owner_token_id=spec.owner_token_id)
    session.add(job)
    session.flush()
    tunable = 0
    for task in tasks:
        template = template_for(task.op, spec.target)
        session.add(JobTask(
            job_id=job.id, task_id=task.id, trials_budget=spec.trials_per_task if template else 0,
            template=template.name if template else None,
            template_version=int(template.version) if template else None, trials_done=0,
            status=TaskStatus.QUEUED if template else TaskStatus.SKIPPED,
            message="" if template else f"no template for {task.op} on {spec.target}",
        ))
        tunable += template is not None
    if not tunable:
        raise InvalidInputError(f"no task of this job has a template for target {spec.target!r}")
    logger.info("created job %d: %d tasks (%d tunable) on %s", job.id, len(tasks), tunable,
                spec.target)
    return job


def _check_spec(spec: JobSpec) -> None:
    from tuner_service.tuners import tuner_names

    if spec.tuner not in tuner_names():
        raise InvalidInputError(
            f"unknown tuner {spec.tuner!r}; choose from {', '.join(tuner_names())}")
    if (spec.model_id is None) == (not spec.workloads):
        raise InvalidInputError("give exactly one of 'model_id' and 'workloads'")
    if not spec.target.strip():
        raise InvalidInputError("'target' must not be empty")


def _parsed(tasks: Sequence[Task]) -> Iterator[tuple[str, Workload]]:
    for task in tasks:
        try:
            yield task.workload_key, parse_workload(task.workload_key)
        except InvalidWorkloadError as e:  # a model stored by an older version
            raise InvalidInputError(f"task {task.id}: {e}") from e


def _model_tasks(session: Session, model_id: int | None) -> list[Task]:
    if session.get(Model, model_id) is None:
        raise NotFoundError(f"model {model_id} not found")
    tasks = list(session.scalars(select(Task).where(Task.model_id == model_id).order_by(Task.id)))
    if not tasks:
        raise InvalidInputError(f"model {model_id} has no tunable tasks")
    return tasks


def _workload_tasks(session: Session, keys: Sequence[str]) -> list[Task]:
    """One task per distinct workload; repeats add to its weight."""
    weights: collections.Counter[str] = collections.Counter()
    parsed = {}
    for position, key in enumerate(keys):
        try:
            workload = parse_workload(key)
        except InvalidWorkloadError as e:
            raise InvalidInputError(f"workloads[{position}]: {e}") from e
        parsed[workload.key] = workload
        weights[workload.key] += 1
    tasks = [Task(model_id=None, workload_key=k, op=w.op, weight=weights[k], flops=w.flops(),
                  nodes=[]) for k, w in parsed.items()]
    session.add_all(tasks)
    session.flush()
    return tasks


def cancel_job(session: Session, job: Job) -> None:
    """Stop a job: queued candidates are withdrawn; leased ones may still report."""
    # Lock the row first: a driver step in flight finishes (and commits its new candidates)
    # before the queued ones are withdrawn.
    session.refresh(job, with_for_update=True)
    if job.status in JOB_FINAL:
        return
    task_ids = select(JobTask.id).where(JobTask.job_id == job.id).scalar_subquery()
    session.execute(update(Measurement)
                    .where(Measurement.job_task_id.in_(task_ids),
                           Measurement.state == MeasurementState.QUEUED)
                    .values(state=MeasurementState.CANCELLED)
                    .execution_options(synchronize_session=False))
    job.status = JobStatus.CANCELLED
    job.finished_at = utcnow()
    job.driver_owner = None

