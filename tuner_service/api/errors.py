"""Expected failures become clear JSON answers (``{"detail": ...}``), never a 500."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from schedule_templates.errors import ScheduleError
from tuner_service.db.errors import AuthError, TunerServiceError

logger = logging.getLogger(__name__)


async def _service_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, TunerServiceError)
    detail = exc.args[0] if exc.args else type(exc).__name__
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, AuthError) else None
    if exc.status_code >= 500:
        logger.warning("%s: %s", type(exc).__name__, detail)
    return JSONResponse({"detail": detail}, status_code=exc.status_code, headers=headers)


async def _schedule_error(_request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=422)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(TunerServiceError, _service_error)
    app.add_exception_handler(ScheduleError, _schedule_error)
