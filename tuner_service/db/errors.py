"""The database's failures, translated at the session edge (``db.engine``) into the package's
error tree (``tuner_service.errors``); the API answers them with 503 and ``Retry-After``."""

from __future__ import annotations

from tuner_service.errors import TunerServiceError


class DatabaseError(TunerServiceError):
    """The database failed or is unreachable (translated at the session edge)."""


class DatabaseBusyError(DatabaseError):
    """The wait for SQLite's write lock (or a pooled connection) passed its bound."""


class SchemaOutdatedError(TunerServiceError):
    """The database is not at the migration head; the message says what to run."""
