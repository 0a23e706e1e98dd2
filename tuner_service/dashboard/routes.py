"""The dashboard's JSON reads (under ``/api/v1/dashboard``) and its page routes.

The JSON reads follow the API's rule for user data (open unless ``read_requires_token``; then
a user or admin token, never a worker's). The pages are
one static shell: it holds no data, so it is served without a token and asks for one when a
read answers 401.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse

from tuner_service.api.deps import JobDep, SessionDep, SettingsDep, UserReader
from tuner_service.api.schemas import MAX_ID
from tuner_service.dashboard import queries

api = APIRouter(prefix="/dashboard", tags=["dashboard"])
pages = APIRouter(include_in_schema=False)


@api.get("/jobs")
def dashboard_jobs(
    _reader: UserReader,
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> dict[str, Any]:
    """The newest jobs with progress and the current end-to-end latency estimate."""
    return {"jobs": queries.jobs_overview(session, limit),
            "server_time": queries.server_time(session)}


@api.get("/jobs/{job_id}")
def dashboard_job(
    _reader: UserReader,
    job: JobDep,
    session: SessionDep,
    since_id: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
) -> dict[str, Any]:
    """A job, its tasks, and its finished measurements after ``since_id`` (see ``cursor``)."""
    return queries.job_snapshot(session, job, since_id)


@api.get("/workers")
def dashboard_workers(_reader: UserReader, session: SessionDep, settings: SettingsDep
                      ) -> dict[str, Any]:
    """Workers with online state, throughput, error mix and median time split per candidate."""
    return {"workers": queries.worker_stats(session, settings.heartbeat_s),
            "heartbeat_s": settings.heartbeat_s,
            "rate_window_s": queries.RATE_WINDOW_S, "error_window_s": queries.ERROR_WINDOW_S,
            "server_time": queries.server_time(session)}


@api.get("/tuning-log")
def dashboard_tuning_log(
    _reader: UserReader,
    session: SessionDep,
    op: Annotated[str | None, Query(max_length=64)] = None,
    target: Annotated[str | None, Query(max_length=255)] = None,
    workload: Annotated[str | None, Query(max_length=512)] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 5000,
) -> dict[str, Any]:
    """The shared log's best configs, described in words, with the operators and targets."""
    return queries.tuning_log(session, op, target, workload, limit)


def _shell() -> HTMLResponse:
    shell = files("tuner_service.dashboard").joinpath("static").joinpath("index.html")
    html = shell.read_text("utf-8")
    return HTMLResponse(html, headers={"Cache-Control": "no-cache"})


@pages.get("/")
def page_jobs() -> HTMLResponse:
    return _shell()


@pages.get("/jobs/{job_id}")
def page_job(job_id: int) -> HTMLResponse:
    return _shell()


@pages.get("/workers")
def page_workers() -> HTMLResponse:
    return _shell()


@pages.get("/tuning-log")
def page_tuning_log() -> HTMLResponse:
    return _shell()
