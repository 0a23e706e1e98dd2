"""Expected failures become clear JSON answers (``{"detail": ...}``), never a 500.

This is the one place an error class becomes an HTTP status: the rest of the package raises
``tuner_service.errors`` in words and knows nothing of HTTP. The handlers themselves must not
fail: a 422 names what was wrong without echoing values that JSON cannot carry (NaN, bytes, lone
surrogates), and a 503 says when to try again (``Retry-After``), so a worker backs off instead
of hammering a busy database.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from schedule_templates.errors import ScheduleError
from tuner_service.db.errors import DatabaseBusyError, DatabaseError, SchemaOutdatedError
from tuner_service.db.values import safe_json
from tuner_service.errors import (
    AuthError,
    ConflictError,
    ForbiddenError,
    InvalidInputError,
    NotFoundError,
    PayloadTooLargeError,
    TunerServiceError,
    UnavailableError,
)

logger = logging.getLogger(__name__)

V = TypeVar("V")

#: the HTTP status of each error class; an error takes its nearest ancestor's, else 500
STATUS: Mapping[type[Exception], int] = {
    NotFoundError: 404,
    InvalidInputError: 422,
    ConflictError: 409,
    PayloadTooLargeError: 413,
    AuthError: 401,
    ForbiddenError: 403,
    DatabaseError: 503,
    SchemaOutdatedError: 503,
    UnavailableError: 503,
}
#: seconds a client should wait before trying again (sent as ``Retry-After``)
RETRY_AFTER_S: Mapping[type[Exception], int] = {DatabaseError: 2, DatabaseBusyError: 1}


def nearest(table: Mapping[type[Exception], V], error: Exception) -> V | None:
    """The entry of ``table`` for the closest class of ``error`` (itself first), or None."""
    return next((table[cls] for cls in type(error).__mro__ if cls in table), None)


async def _service_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, TunerServiceError)
    detail = exc.args[0] if exc.args else type(exc).__name__
    status = nearest(STATUS, exc) or 500
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, AuthError) else {}
    retry_after_s = nearest(RETRY_AFTER_S, exc)
    if retry_after_s is not None:
        headers["Retry-After"] = str(retry_after_s)
    if status >= 500:
        logger.warning("%s: %s", type(exc).__name__, detail)
    return JSONResponse({"detail": safe_json(detail)}, status_code=status,
                        headers=headers or None)


async def _schedule_error(_request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": safe_json(str(exc))}, status_code=422)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's own handler echoes each error's input, which may be NaN, bytes or a lone
    surrogate that JSON cannot carry; this one keeps location, message and type only."""
    assert isinstance(exc, RequestValidationError)
    try:
        detail = [_error(e) for e in list(exc.errors())[:50]]
    except Exception:  # never fail while reporting a failure
        logger.exception("could not describe a validation error")
        detail = [{"loc": [], "msg": "invalid request", "type": "value_error"}]
    return JSONResponse({"detail": detail}, status_code=422)


def _error(error: Any) -> dict[str, Any]:
    return {"loc": safe_json(list(error.get("loc", ()))),
            "msg": safe_json(str(error.get("msg", "invalid value"))),
            "type": safe_json(str(error.get("type", "value_error")))}


async def _http_error(request: Request, exc: Exception) -> Any:
    """A body nested too deep for the JSON decoder is the client's fault: 422, not a 400
    that hides why (FastAPI reports any decoder crash as "error parsing the body")."""
    assert isinstance(exc, StarletteHTTPException)
    if isinstance(exc.__cause__, RecursionError):
        return JSONResponse({"detail": [{"loc": ["body"], "msg": "JSON nested too deep",
                                         "type": "json_too_deep"}]}, status_code=422)
    return await http_exception_handler(request, exc)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(TunerServiceError, _service_error)
    app.add_exception_handler(ScheduleError, _schedule_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
