"""Why an active job is not making progress: no worker can serve it, or every result fails.

A job waiting for a worker that never comes looks like a job at 0 trials; these states are
reported with the job (REST, dashboard, ``tuner submit --wait``) so the user sees the cause.
"""

from __future__ import annotations

import collections
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from schedule_templates.protocol import Target
from schedule_templates.records import ErrorKind
from tuner_service.db.models import Job, JobTask, Measurement
from tuner_service.db.states import JOB_ACTIVE, MeasurementState
from tuner_service.jobs.queue import live_workers

#: a worker seen within this many seconds counts as online (six default heartbeat periods: an
#: idle worker long-polls its claims, a busy one heartbeats the items it holds)
ONLINE_WINDOW_S = 60.0
#: this many failures in a row, with no success, make "all results failing"
FAILING_AFTER = 8

_ERROR_NAMES = {ErrorKind.INSTANTIATION: "invalid config",
                ErrorKind.COMPILE_HOST: "host compile error",
                ErrorKind.COMPILE_DEVICE: "device compile error",
                ErrorKind.RUNTIME: "runtime error", ErrorKind.WRONG_ANSWER: "wrong answer",
                ErrorKind.BUILD_TIMEOUT: "build timeout", ErrorKind.RUN_TIMEOUT: "run timeout",
                ErrorKind.UNKNOWN: "unknown error"}


def job_health(session: Session, job: Job, window_s: float = ONLINE_WINDOW_S
               ) -> dict[str, Any] | None:
    """``{"state": "no_workers" | "failing", "message": ...}`` for a stuck active job, else
    None (finished jobs and healthy ones)."""
    if job.status not in JOB_ACTIVE:
        return None
    if live_workers(session, job.target, job.device_key, window_s) == 0:
        device = f" and device key {job.device_key!r}" if job.device_key else ""
        return {"state": "no_workers", "message": (
            f"no worker online for target {job.target!r}{device}; start one with "
            f"`tuner worker --server URL --token TOKEN --target {Target.parse(job.target).kind}"
            f" --device-key {job.device_key or 'KEY'}`")}
    recent = session.execute(
        select(Measurement.error_kind, Measurement.error_message)
        .join(JobTask, JobTask.id == Measurement.job_task_id)
        .where(JobTask.job_id == job.id, Measurement.state == MeasurementState.DONE)
        .order_by(Measurement.id.desc()).limit(FAILING_AFTER)
    ).all()
    if len(recent) < FAILING_AFTER or any(not kind for kind, _ in recent):
        return None
    kinds = collections.Counter(kind or ErrorKind.NONE for kind, _ in recent)
    kind = kinds.most_common(1)[0][0]
    example = next((msg for k, msg in recent if k == kind and msg), "")
    detail = f": {example.splitlines()[0][:200]}" if example else ""
    return {"state": "failing", "message": (
        f"the last {len(recent)} results all failed (mostly "
        f"{_ERROR_NAMES.get(kind, f'error {kind}')}{detail}); see the workers' logs")}
