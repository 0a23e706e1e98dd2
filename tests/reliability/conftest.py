"""Fixtures for the reliability tests: PostgreSQL schemas, live processes that are always
stopped at the end, and a direct look at the database."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rel_live import (
    LiveServer,
    LiveWorker,
    Process,
    postgres_reason,
    postgres_schema,
)


@pytest.fixture(scope="session")
def pg_reason(postgres_lock: Any) -> str:
    with postgres_lock.shared():  # not while another test restarts the server
        return postgres_reason()


@pytest.fixture
def pg_url(pg_reason: str, postgres_lock: Any) -> Iterator[str]:
    """A migrated private schema in the shared PostgreSQL (skipped when unreachable); held
    shared in ``postgres_lock`` (tests/conftest.py) until the schema is dropped."""
    if pg_reason:
        pytest.skip(pg_reason)
    with postgres_lock.shared(), postgres_schema() as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    from tuner_service.db.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    upgrade(url)
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def any_url(request: pytest.FixtureRequest) -> str:
    """Both databases, migrated."""
    name = "sqlite_url" if request.param == "sqlite" else "pg_url"
    url: str = request.getfixturevalue(name)
    return url


class Launcher:
    """Starts servers and workers for one test and stops every one of them afterwards."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[Process] = []

    def server(self, database_url: str, **settings: Any) -> LiveServer:
        server = LiveServer(database_url, self.workdir, **settings)
        self.started.append(server)
        return server.start()

    def worker(self, server: LiveServer, name: str, **settings: Any) -> LiveWorker:
        worker = LiveWorker(server, self.workdir, name, **settings)
        self.started.append(worker)
        return worker.start()

    def close(self) -> None:
        for process in reversed(self.started):
            process.stop(timeout_s=10)


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launcher]:
    launcher = Launcher(tmp_path)
    try:
        yield launcher
    finally:
        launcher.close()


@pytest.fixture
def db_rows() -> Iterator[Callable[..., list[Any]]]:
    """``db_rows(url, sql, **params)``: rows of one query, straight from the database."""
    from sqlalchemy import text

    from tuner_service.db.engine import Database

    opened: dict[str, Database] = {}

    def rows(url: str, sql: str, **params: Any) -> list[Any]:
        db = opened.setdefault(url, Database(url))
        with db.engine.connect() as conn:
            return list(conn.execute(text(sql), params).all())

    yield rows
    for db in opened.values():
        db.dispose()
