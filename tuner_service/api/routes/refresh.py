"""What a nightly refresh needs from the shared log: the stale entries, and the whole log as
AutoTVM-style lines (``tuner refresh`` creates the jobs through ``POST /jobs``)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from tuner_service.api.deps import Reader, SessionDep, SettingsDep, UserReader
from tuner_service.jobs.log_export import autotvm_log_lines
from tuner_service.jobs.stale import find_stale

router = APIRouter(tags=["tuning log"])


class StaleItemPublic(BaseModel):
    workload: str
    op: str
    target: str
    reason: str
    detail: str
    device_key: str | None
    template: str | None
    template_version: int | None
    current_template: str | None
    current_version: int | None
    last_measured_at: dt.datetime | None
    gflops: float | None
    #: the device class whose entry is refreshed, and the threads to measure with
    device_class: str | None = None
    threads: int | None = None


class StaleReportPublic(BaseModel):
    checked_at: dt.datetime
    older_than_days: float
    #: what to tune again, oldest template first, then by age, then missing entries
    items: list[StaleItemPublic]
    #: stale but not tunable now (no template, or no online worker for the target)
    skipped: list[StaleItemPublic]


@router.get("/tuning-log/stale", response_model=StaleReportPublic)
def get_stale(
    _reader: UserReader,
    session: SessionDep,
    settings: SettingsDep,
    older_than_days: Annotated[float, Query(ge=0, le=36_500)] = 7.0,
    target: Annotated[str | None, Query(max_length=255)] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
) -> dict[str, Any]:
    """Entries to tune again: older template, not measured within the window, or missing on a
    target that now has online workers."""
    report = find_stale(session, older_than_days, settings.heartbeat_s, target or None, limit)
    return report.to_json()


@router.get("/tuning-log/autotvm", response_class=PlainTextResponse,
            responses={200: {"content": {"application/x-ndjson": {}}}})
def get_tuning_log_autotvm(
    _reader: Reader,
    session: SessionDep,
    target: Annotated[str | None, Query(max_length=255)] = None,
    op: Annotated[str | None, Query(max_length=64)] = None,
) -> PlainTextResponse:
    """The best record of every (workload, target) as AutoTVM-style JSON lines."""
    body = "".join(autotvm_log_lines(session, target or None, op or None))
    return PlainTextResponse(body, media_type="application/x-ndjson")
