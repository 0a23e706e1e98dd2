"""The package's root exception and the expected failures the API turns into 4xx/503 answers."""

from __future__ import annotations


class TunerServiceError(Exception):
    """Root of every error ``tuner_service`` raises on purpose."""

    status_code = 500
    #: seconds a client should wait before trying again (sent as ``Retry-After``); None: never
    retry_after_s: int | None = None


class NotFoundError(TunerServiceError):
    status_code = 404


class InvalidInputError(TunerServiceError):
    """A request that names an invalid workload, config, tuner or model."""

    status_code = 422


class ConflictError(TunerServiceError):
    status_code = 409


class PayloadTooLargeError(TunerServiceError):
    status_code = 413


class AuthError(TunerServiceError):
    status_code = 401


class ForbiddenError(TunerServiceError):
    status_code = 403


class DatabaseError(TunerServiceError):
    """The database failed or is unreachable (translated at the session edge)."""

    status_code = 503
    retry_after_s = 2


class DatabaseBusyError(DatabaseError):
    """The wait for SQLite's write lock (or a pooled connection) passed its bound."""

    retry_after_s = 1


class SchemaOutdatedError(TunerServiceError):
    """The database is not at the migration head; the message says what to run."""

    status_code = 503


class UnavailableError(TunerServiceError):
    """An optional part (the ONNX frontend) is not installed."""

    status_code = 503
