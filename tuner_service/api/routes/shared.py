"""The shared tuning log: best config lookups, the log itself, record export/import, health."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import PlainTextResponse
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from tuner_service.api.deps import DbDep, Reader, SessionDep, SettingsDep, UserReader, UserToken
from tuner_service.api.schemas import Health, ImportAnswer, Timestamp, TuningLogPublic
from tuner_service.errors import PayloadTooLargeError, TunerServiceError
from tuner_service.jobs import log, records

router = APIRouter(tags=["tuning log"])


@router.get("/best", response_model=TuningLogPublic)
def get_best(
    _reader: Reader,
    session: SessionDep,
    workload: Annotated[str, Query(max_length=512)],
    target: Annotated[str, Query(max_length=255)] = "llvm",
    device_class: Annotated[str | None, Query(max_length=255)] = None,
    threads: Annotated[int | None, Query(ge=1, le=4096)] = None,
) -> dict[str, Any]:
    """With ``device_class``: exact class, same microarchitecture, same ISA level, else the
    template default (``match`` says which); without, the fastest entry of any class."""
    return log.best(session, workload, target, device_class, threads)


@router.get("/tuning-log", response_model=list[TuningLogPublic])
def get_tuning_log(
    _reader: Reader,
    session: SessionDep,
    op: Annotated[str | None, Query(max_length=64)] = None,
    target: Annotated[str | None, Query(max_length=255)] = None,
    workload: Annotated[str | None, Query(max_length=512)] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
    device_class: Annotated[str | None, Query(max_length=255)] = None,
) -> list[dict[str, Any]]:
    return log.entries(session, op, target, workload, limit, device_class)


@router.get("/records", response_class=PlainTextResponse,
            responses={200: {"content": {"application/x-ndjson": {}}}})
def get_records(
    _reader: UserReader,
    session: SessionDep,
    workload: Annotated[str | None, Query(max_length=512)] = None,
    target: Annotated[str | None, Query(max_length=255)] = None,
    since: Annotated[Timestamp | None, Query()] = None,
) -> PlainTextResponse:
    key = log.canonical_key(workload) if workload else None
    body = "".join(records.export_lines(session, key, target, since))
    return PlainTextResponse(body, media_type="application/x-ndjson")


@router.post("/records", response_model=ImportAnswer)
async def post_records(
    _token: UserToken,
    request: Request,
    db: DbDep,
    settings: SettingsDep,
) -> dict[str, Any]:
    """JSON lines in the body; every line is validated, then all are stored in one transaction."""
    raw = await _read_body(request, settings.max_upload_bytes)

    def store() -> dict[str, Any]:
        with db.session() as session:
            return records.import_lines(session, raw.decode("utf-8", errors="replace"),
                                        settings.max_import_lines)

    answer: dict[str, Any] = await run_in_threadpool(store)
    return answer


async def _read_body(request: Request, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"body larger than the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


@router.get("/health", response_model=Health)
def get_health(db: DbDep) -> dict[str, Any]:
    try:
        with db.read_session() as session:
            revision = session.execute(text("SELECT version_num FROM alembic_version")).scalar()
        state = "ok"
    except TunerServiceError:
        revision, state = None, "unavailable"
    return {"status": "ok" if state == "ok" else "degraded", "database": state,
            "schema_revision": revision, "version": _version()}


def _version() -> str:
    try:
        return version("tuner")
    except PackageNotFoundError:
        return "0+unknown"
