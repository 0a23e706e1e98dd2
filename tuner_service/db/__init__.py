"""Database layer: tables, engine and session scope, migrations, errors."""

from tuner_service.db.engine import Database, make_engine, normalize_url
from tuner_service.db.errors import TunerServiceError

__all__ = ["Database", "TunerServiceError", "make_engine", "normalize_url"]
