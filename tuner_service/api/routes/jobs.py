"""Jobs: create, list, status, best configs, per-task history, cancel."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import PlainTextResponse

from tuner_service.api.deps import (
    DriverDep,
    JobDep,
    OwnedJob,
    SessionDep,
    SettingsDep,
    UserReader,
    UserToken,
)
from tuner_service.api.schemas import (
    MAX_ID,
    JobConfigs,
    JobCreate,
    JobCreated,
    JobHistory,
    JobListItem,
    JobPublic,
)
from tuner_service.jobs import views
from tuner_service.jobs.budget import ResourceBudget
from tuner_service.jobs.create import JobSpec, cancel_job, create_job

router = APIRouter(tags=["jobs"])


@router.post("/jobs", response_model=JobCreated, status_code=201)
def post_job(
    token: UserToken,
    body: JobCreate,
    session: SessionDep,
    settings: SettingsDep,
    driver: DriverDep,
) -> JobCreated:
    spec = JobSpec(
        target=body.target, trials_per_task=body.trials_per_task, tuner=body.tuner,
        model_id=body.model_id, workloads=tuple(body.workloads or ()),
        device_key=body.device_key, threads=body.threads or settings.measure_threads,
        options={**settings.measure_options().to_json(),
                 **body.options.model_dump(exclude_none=True)},
        owner_token_id=token.id,
    )
    job = create_job(session, spec, ResourceBudget.from_settings(settings))
    if driver is not None:
        driver.wake()
    return JobCreated(job_id=job.id)


@router.get("/jobs", response_model=list[JobListItem])
def get_jobs(
    _reader: UserReader,
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    return views.list_jobs(session, limit)


@router.get("/jobs/{job_id}", response_model=JobPublic)
def get_job(_reader: UserReader, job: JobDep, session: SessionDep) -> dict[str, Any]:
    return views.job_status(session, job)


@router.get("/jobs/{job_id}/configs", response_model=JobConfigs,
            responses={200: {"content": {"application/x-ndjson": {}}}})
def get_configs(
    _reader: UserReader,
    job: JobDep,
    session: SessionDep,
    format: Literal["json", "autotvm"] = "json",
) -> Any:
    if format == "autotvm":
        text = "".join(views.autotvm_lines(session, job))
        return PlainTextResponse(text, media_type="application/x-ndjson")
    return {"job_id": job.id, "target": job.target, "status": job.status,
            "threads": job.threads, "tasks": views.best_configs(session, job)}


@router.get("/jobs/{job_id}/history", response_model=JobHistory)
def get_history(
    _reader: UserReader,
    job: JobDep,
    session: SessionDep,
    task_id: Annotated[int, Query(ge=1, le=MAX_ID)],
    after: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
) -> dict[str, Any]:
    points = views.history(session, job.id, task_id, after)
    return {"job_id": job.id, "task_id": task_id, "points": points}


@router.post("/jobs/{job_id}/cancel", response_model=JobPublic)
def post_cancel(job: OwnedJob, session: SessionDep) -> dict[str, Any]:
    """Cancel a job: its owner (the token that created it) or an admin; others get 403."""
    cancel_job(session, job)
    return views.job_status(session, job)
