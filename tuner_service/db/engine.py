"""Engines and the one session scope: commit on success, roll back on error, always close.

Database errors are translated here into ``DatabaseError``/``ConflictError`` so callers above
this edge never see SQLAlchemy exceptions.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from tuner_service.db.errors import ConflictError, DatabaseError, TunerServiceError

T = TypeVar("T")
#: PostgreSQL SQLSTATEs of transactions that are safe to run again: deadlock, serialization
_RETRYABLE = ("40P01", "40001")
logger = logging.getLogger(__name__)


def normalize_url(url: str) -> str:
    """Plain ``postgresql://`` URLs use psycopg 3 (the driver we install)."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def make_engine(url: str) -> Engine:
    url = normalize_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(url, parsed.database)
    # pre-ping lets the pool recover by itself after a database restart
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=30)


def _sqlite_engine(url: str, path: str | None) -> Engine:
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url, connect_args={"check_same_thread": False, "timeout": 30, "isolation_level": None}
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        cursor = dbapi_conn.cursor()
        for pragma in ("journal_mode=WAL", "foreign_keys=ON", "busy_timeout=30000",
                       "synchronous=NORMAL"):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Take the write lock up front: a deferred transaction that reads and then writes can
        # fail with "database is locked" when another writer committed in between.
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


class Database:
    """An engine plus its session factory; one per process (or per app in tests)."""

    def __init__(self, url: str) -> None:
        self.url = normalize_url(url)
        self.engine = make_engine(self.url)
        self._factory = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def session_factory(self) -> sessionmaker[Session]:
        """The factory behind ``session()``: a target for session events (metrics)."""
        return self._factory

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        session = self._factory()
        try:
            yield session
            session.commit()
        except TunerServiceError:
            session.rollback()
            raise
        except IntegrityError as e:
            session.rollback()
            raise ConflictError(f"conflicting write: {e.orig}") from e
        except SQLAlchemyError as e:
            session.rollback()
            logger.warning("database error: %s", e)
            raise DatabaseError(f"database unavailable or failed: {type(e).__name__}") from e
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def run(self, work: Callable[[Session], T], attempts: int = 4) -> T:
        """``work`` in one transaction, retried when PostgreSQL aborts it for a deadlock or a
        serialization failure (concurrent workers reporting results can cross row locks)."""
        for attempt in range(attempts):
            try:
                with self.session() as session:
                    return work(session)
            except DatabaseError as e:
                orig = getattr(e.__cause__, "orig", None)
                if attempt + 1 == attempts or getattr(orig, "sqlstate", None) not in _RETRYABLE:
                    raise
                logger.info("transaction aborted (%s); retrying", getattr(orig, "sqlstate", ""))
                time.sleep(random.uniform(0.005, 0.05) * (attempt + 1))
        raise AssertionError("unreachable")

    def dispose(self) -> None:
        self.engine.dispose()
