"""The worker protocol (docs/worker-protocol.md) and the worker list."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from tuner_service.api.deps import (
    SessionDep,
    SettingsDep,
    UserReader,
    WorkerDep,
    WorkerId,
    WorkerToken,
)
from tuner_service.api.wire import json_response, raw_body_doc, read_json, validate
from tuner_service.api.worker_auth import authorized_worker
from tuner_service.api.worker_schemas import (
    ClaimAnswer,
    ClaimRequest,
    HeartbeatAnswer,
    MeasureIds,
    ReleaseAnswer,
    ResultsAnswer,
    ResultsIn,
    WorkerPublic,
    WorkerRegister,
    WorkerRegistered,
)
from tuner_service.db.engine import Database
from tuner_service.errors import ForbiddenError
from tuner_service.jobs import log, queue
from tuner_service.settings import Settings

router = APIRouter(tags=["workers"])

POLL_S = 0.2
#: the bearer-token requirement that FastAPI documents for routes with the token dependency
BEARER_DOC: dict[str, Any] = {"security": [{"HTTPBearer": []}]}


@router.post("/workers/register", response_model=WorkerRegistered, status_code=201)
def register(
    token: WorkerToken,
    body: WorkerRegister,
    session: SessionDep,
    settings: SettingsDep,
) -> WorkerRegistered:
    if token.device_key is not None and body.device_key != token.device_key:
        raise ForbiddenError(
            f"this worker token is bound to device key {token.device_key!r}, not "
            f"{body.device_key!r}: start the worker with --device-key {token.device_key} or "
            "create a token for this device (tuner token create --role worker --device-key K)")
    worker = queue.register_worker(session, body.model_dump(), token.id)
    return WorkerRegistered(worker_id=worker.id, lease_s=settings.lease_s,
                            heartbeat_s=settings.heartbeat_s)


@router.post("/workers/{worker_id}/heartbeat", response_model=HeartbeatAnswer)
def post_heartbeat(
    body: MeasureIds,
    worker: WorkerDep,
    session: SessionDep,
    settings: SettingsDep,
) -> HeartbeatAnswer:
    extended, lost = queue.heartbeat(session, worker.id, body.measure_ids, settings.lease_s)
    return HeartbeatAnswer(extended=extended, lost=lost)


# The claim and the report are most of what a busy server answers: they take the request
# itself (``api.wire``: one decode, the schema's own validation, one encode) and check the token
# through ``api.worker_auth``'s short-lived grants instead of FastAPI dependencies, which cost
# a trip through the thread pool each (the other worker routes keep them).

@router.post("/workers/{worker_id}/claim", response_model=ClaimAnswer,
             openapi_extra={**raw_body_doc(ClaimRequest), **BEARER_DOC})
async def post_claim(request: Request, worker_id: WorkerId) -> Response:
    """Long-poll: try at once, then every 0.2 s until items arrive or ``wait_s`` passes.
    Each try is one short transaction with the same few statements whatever ``max_items``."""
    raw = await read_json(request)
    worker = await authorized_worker(request, worker_id)
    body = validate(ClaimRequest, raw)
    state = request.app.state
    settings: Settings = state.settings
    deadline = time.monotonic() + min(body.wait_s, settings.claim_max_wait_s)
    max_items = min(body.max_items, settings.claim_max_items)
    options = settings.measure_options().to_json()
    while True:
        items = await run_in_threadpool(queue.claim_batch, state.db, worker, max_items,
                                        settings.lease_s, options)
        if state.driver is not None:  # a short answer refills the queue now, not later
            state.driver.note_claim(worker.id, max_items, len(items))
        left = deadline - time.monotonic()
        if items or left <= 0:
            return json_response({"items": [item.to_json() for item in items]})  # ClaimAnswer
        await asyncio.sleep(min(POLL_S, left))


@router.post("/workers/{worker_id}/results", response_model=ResultsAnswer,
             openapi_extra={**raw_body_doc(ResultsIn), **BEARER_DOC})
async def post_results(request: Request, worker_id: WorkerId) -> Response:
    # one transaction for the whole batch (``jobs.reports``), its rows locked in id order;
    # retried if PostgreSQL still picks it as a deadlock victim
    raw = await read_json(request)
    worker = await authorized_worker(request, worker_id)
    body = validate(ResultsIn, raw)
    reported = sorted((r.to_report() for r in body.results), key=lambda item: item.measure_id)
    problems = {r.measure_id: r.invalid for r in body.results if r.invalid}
    db: Database = request.app.state.db
    answer = await run_in_threadpool(
        db.run, lambda session: queue.report_results(session, worker, reported, problems))
    driver = request.app.state.driver
    if driver is not None and answer["accepted"]:
        driver.wake()
    return json_response(answer)


@router.post("/workers/{worker_id}/release", response_model=ReleaseAnswer)
def post_release(body: MeasureIds, worker: WorkerDep, session: SessionDep) -> ReleaseAnswer:
    return ReleaseAnswer(released=queue.release(session, worker.id, body.measure_ids))


@router.get("/workers", response_model=list[WorkerPublic])
def get_workers(
    _reader: UserReader,
    session: SessionDep,
    settings: SettingsDep,
) -> list[dict[str, Any]]:
    return log.workers(session, settings.heartbeat_s)
