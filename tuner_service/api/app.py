"""The API's application factory (``tuner_service.app.create_app`` adds the dashboard).

``create_api(settings)`` wires settings, the database and the job driver into ``app.state``;
nothing connects until the app starts. At start it refuses a database that is not at the
migration head (``tuner db upgrade`` fixes that) and starts the job driver thread.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from tuner_service import auth
from tuner_service.api.docs import install_docs
from tuner_service.api.errors import install_error_handlers
from tuner_service.api.limits import FRAMING_SLACK, BodyLimit
from tuner_service.api.metrics import install_metrics
from tuner_service.api.routes import jobs, models, packs, refresh, shared, workers
from tuner_service.api.worker_auth import WorkerGrants
from tuner_service.db.engine import Database
from tuner_service.db.migrate import check_schema
from tuner_service.jobs.driver import JobDriver
from tuner_service.settings import Settings, get_settings

logger = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
#: threads that run request handlers (anyio's default is 40). Handlers mostly wait on the
#: database, so a few keep it busy; forty runnable threads would share the interpreter lock
#: with the job driver's thread and starve it, and a starved driver leaves the queue empty
REQUEST_THREADS = 12


def create_api(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    app = FastAPI(
        title="tuner service",
        summary="Learned-cost-model autotuning: submit models, measure on workers, fetch configs",
        version="0.1.0",
        lifespan=_lifespan,
        docs_url=None,  # served from local files: api/docs.py
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.db = Database(settings.resolved_database_url, settings.database_busy_timeout_s)
    app.state.driver = None
    app.state.worker_grants = WorkerGrants(settings.worker_auth_cache_s)
    install_error_handlers(app)
    app.add_middleware(BodyLimit, limit=settings.max_upload_bytes + FRAMING_SLACK)
    install_metrics(app)
    for router in (models.router, jobs.router, workers.router, shared.router, refresh.router,
                   packs.router):
        app.include_router(router, prefix=API_PREFIX)
    install_docs(app)
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    db: Database = app.state.db
    anyio.to_thread.current_default_thread_limiter().total_tokens = REQUEST_THREADS
    if settings.check_schema:
        await run_in_threadpool(check_schema, db.url)
    for secret, role in ((settings.bootstrap_token, "admin"),
                         (settings.bootstrap_worker_token, "worker")):
        if secret is not None:
            await run_in_threadpool(_bootstrap_token, db, secret.get_secret_value(), role)
    if settings.run_driver:
        app.state.driver = JobDriver(db, settings)
        app.state.driver.start()
    try:
        yield
    finally:
        if app.state.driver is not None:
            await run_in_threadpool(app.state.driver.stop)
            app.state.driver = None
        db.dispose()


def _bootstrap_token(db: Database, secret: str, role: str) -> None:
    with db.session() as session:
        auth.ensure_token(session, secret, role, f"bootstrap ({role})")

