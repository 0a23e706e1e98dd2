"""The worker protocol (docs/worker-protocol.md) and the worker list."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from tuner_service.api.deps import (
    DbDep,
    DriverDep,
    SessionDep,
    SettingsDep,
    UserReader,
    WorkerDep,
    WorkerToken,
)
from tuner_service.api.schemas import (
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
from tuner_service.errors import ForbiddenError
from tuner_service.jobs import log, queue

router = APIRouter(tags=["workers"])

POLL_S = 0.2


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


@router.post("/workers/{worker_id}/claim", response_model=ClaimAnswer)
async def post_claim(
    body: ClaimRequest,
    worker: WorkerDep,
    db: DbDep,
    settings: SettingsDep,
    driver: DriverDep,
) -> ClaimAnswer:
    """Long-poll: try at once, then every 0.2 s until items arrive or ``wait_s`` passes.
    Each try is one short transaction with the same few statements whatever ``max_items``."""
    deadline = time.monotonic() + min(body.wait_s, settings.claim_max_wait_s)
    max_items = min(body.max_items, settings.claim_max_items)
    options = settings.measure_options().to_json()
    while True:
        items = await run_in_threadpool(queue.claim_batch, db, worker, max_items,
                                        settings.lease_s, options)
        if len(items) < max_items and driver is not None:
            driver.wake()  # the queue ran short: refill it now, not at the next interval
        left = deadline - time.monotonic()
        if items or left <= 0:
            return ClaimAnswer.of(items)
        await asyncio.sleep(min(POLL_S, left))


@router.post("/workers/{worker_id}/results", response_model=ResultsAnswer)
def post_results(
    body: ResultsIn,
    worker: WorkerDep,
    db: DbDep,
    driver: DriverDep,
) -> dict[str, Any]:
    # one transaction for the whole batch (``jobs.reports``), its rows locked in id order;
    # retried if PostgreSQL still picks it as a deadlock victim
    reported = sorted((r.to_report() for r in body.results), key=lambda item: item.measure_id)
    problems = {r.measure_id: r.invalid for r in body.results if r.invalid}
    answer = db.run(lambda session: queue.report_results(session, worker, reported, problems))
    if driver is not None and answer["accepted"]:
        driver.wake()
    return answer


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
