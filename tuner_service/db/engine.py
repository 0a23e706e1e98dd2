"""Engines and the session scopes: commit on success, roll back on error, always close.

Two scopes: ``session()`` for work that writes and ``read_session()`` for reads. On SQLite a
write transaction takes the write lock up front (``BEGIN IMMEDIATE``), while a read is a plain
deferred transaction on a pool of its own: in WAL mode readers never wait for the writer nor
block it, so a burst of dashboard reads cannot stall worker claims. Waiting for the write lock
is bounded (``busy_timeout_s``); past it the request fails with ``DatabaseBusyError`` (503 with
``Retry-After``).

Database errors are translated here into ``DatabaseError``/``ConflictError``/``InvalidInputError``
so callers above this edge never see SQLAlchemy exceptions.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    DataError,
    DisconnectionError,
    IntegrityError,
    OperationalError,
    SQLAlchemyError,
    StatementError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session, sessionmaker

from tuner_service.db.errors import DatabaseBusyError, DatabaseError
from tuner_service.errors import ConflictError, InvalidInputError, TunerServiceError

T = TypeVar("T")
#: PostgreSQL SQLSTATEs of transactions that are safe to run again: deadlock, serialization
_RETRYABLE = ("40P01", "40001")
#: how long a SQLite transaction waits for the write lock (and a request for a pooled
#: connection) before it answers 503 instead of hanging
DEFAULT_BUSY_TIMEOUT_S = 10.0
#: execution option that marks a SQLite connection's transactions as deferred reads
_READ = "tuner_read"
#: a pooled PostgreSQL connection unused this long is pinged before use (``_ping_when_idle``)
PING_IDLE_S = 1.0
#: where a pooled connection's record keeps when it was returned to the pool
_IDLE_SINCE = "tuner_idle_since"
def _json(value: Any) -> str:
    """JSON columns hold standard JSON only: NaN or Infinity would be stored by SQLite as text
    that no strict reader (our own import included) accepts, and PostgreSQL refuses them."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError as e:
        raise InvalidInputError(f"a value cannot be stored: {e}") from e
logger = logging.getLogger(__name__)


def normalize_url(url: str) -> str:
    """Plain ``postgresql://`` URLs use psycopg 3 (the driver we install)."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def make_engine(url: str, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
                pool_size: int = 10) -> Engine:
    url = normalize_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(url, parsed.database, busy_timeout_s, pool_size)
    # At most 40 connections, as many kept open as a busy server uses at once: a connection
    # opened for a burst and closed on return (overflow) costs PostgreSQL a new backend
    # process each time. Last in, first out: a busy server cycles through the few it needs.
    engine = create_engine(url, pool_size=max(pool_size, 32), max_overflow=8, pool_use_lifo=True,
                           pool_timeout=busy_timeout_s, json_serializer=_json)
    _ping_when_idle(engine, PING_IDLE_S)
    return engine


def _ping_when_idle(engine: Engine, idle_s: float) -> None:
    """Ping a pooled connection before use when it sat unused for ``idle_s`` or more, and
    replace it if the ping fails: the pool recovers by itself after a database restart.
    SQLAlchemy's ``pool_pre_ping`` pings before every use, a round trip more per transaction
    (a claim is one statement); a connection in use moments ago needs none, and should the
    database have gone meanwhile, the first statement's disconnect error makes the pool
    replace every older connection."""
    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_conn: Any, record: Any) -> None:
        record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get(_IDLE_SINCE)
        if since is None or time.monotonic() - since < idle_s:
            return  # new, or in use moments ago
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except Exception as e:  # the pool opens a new connection and tries again
            raise DisconnectionError(f"stale pooled connection: {e}") from e
        if not alive:
            raise DisconnectionError("stale pooled connection")


def _sqlite_engine(url: str, path: str | None, busy_timeout_s: float, pool_size: int
                   ) -> Engine:
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url, connect_args={"check_same_thread": False, "timeout": busy_timeout_s,
                           "isolation_level": None},
        pool_size=pool_size, max_overflow=pool_size * 4, pool_timeout=busy_timeout_s,
        json_serializer=_json,
    )
    busy_ms = int(busy_timeout_s * 1000)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        cursor = dbapi_conn.cursor()
        for pragma in ("journal_mode=WAL", "foreign_keys=ON", f"busy_timeout={busy_ms}",
                       "synchronous=NORMAL"):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # A write takes the lock up front: a deferred transaction that reads and then writes
        # can fail with "database is locked" when another writer committed in between. A read
        # stays deferred, so it never queues behind (or holds up) the writer.
        read = conn.get_execution_options().get(_READ, False)
        conn.exec_driver_sql("BEGIN" if read else "BEGIN IMMEDIATE")

    return engine


class Database:
    """Engines plus their session factories; one per process (or per app in tests)."""

    def __init__(self, url: str, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> None:
        self.url = normalize_url(url)
        self.engine = make_engine(self.url, busy_timeout_s)
        self._factory = sessionmaker(self.engine, expire_on_commit=False)
        self._read_engine: Engine | None = None
        reads: Engine = self.engine
        if self.engine.dialect.name == "sqlite":
            # reads on a pool of their own: a burst of them never takes the writers' connections.
            # Sized for a burst of 200 dashboard readers (64 kept + 4x overflow = 320): with 20
            # (+80) and the API's 12 handler threads (REQUEST_THREADS), such a burst sometimes
            # waited past the busy timeout for a connection and got 503s.
            self._read_engine = make_engine(self.url, busy_timeout_s, pool_size=64)
            reads = self._read_engine.execution_options(**{_READ: True})
        self._read_factory = sessionmaker(reads, expire_on_commit=False)

    @property
    def session_factory(self) -> sessionmaker[Session]:
        """The factory behind ``session()``: a target for session events (metrics)."""
        return self._factory

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A transaction that may write (on SQLite it holds the write lock throughout)."""
        with _scope(self._factory) as session:
            yield session

    @contextmanager
    def read_session(self) -> Iterator[Session]:
        """A transaction that only reads: never takes or waits for SQLite's write lock."""
        with _scope(self._read_factory) as session:
            yield session

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
        if self._read_engine is not None:
            self._read_engine.dispose()


@contextmanager
def _scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    session = factory()
    try:
        yield session
        session.commit()
    except TunerServiceError:
        session.rollback()
        raise
    except SQLAlchemyError as e:
        session.rollback()
        raise translate(e) from e
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def translate(e: SQLAlchemyError) -> TunerServiceError:
    """The service error for a database error: what the client should do about it."""
    if isinstance(e, IntegrityError):
        return ConflictError(f"conflicting write: {e.orig}")
    if isinstance(e, StatementError) and isinstance(e.orig, TunerServiceError):
        return e.orig  # raised while binding a value (``_json``)
    if isinstance(e, DataError):  # a value the database cannot hold: the request's fault
        logger.info("database refused a value: %s", e.orig)
        return InvalidInputError(f"a value cannot be stored: {_first_line(e.orig)}")
    if isinstance(e, PoolTimeoutError) or (
            isinstance(e, OperationalError) and "database is locked" in str(e.orig)):
        logger.warning("database busy: %s", _first_line(getattr(e, "orig", None) or e))
        return DatabaseBusyError("database busy; try again shortly")
    logger.warning("database error: %s", e)
    return DatabaseError(f"database unavailable or failed: {type(e).__name__}")


def _first_line(error: object) -> str:
    return str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
