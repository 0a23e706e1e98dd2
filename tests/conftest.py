"""Shared fixtures: ``database_url`` runs a test on SQLite (a temporary file) and on PostgreSQL
(a fresh schema in 127.0.0.1:5432/test, dropped afterwards; skipped when unreachable).

Tests on the shared PostgreSQL hold ``postgres_lock`` shared; the one that restarts the server
holds it alone, so no test of another pytest worker (``-n 2``) meets the restart. A test marked
``alone`` runs while no test of another pytest process runs (``machine_lock``)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # the server extras: imported by the fixtures that use them, not at load
    from fastapi.testclient import TestClient

    from tuner_service.settings import Settings

# -- library builds: the same pure compile steps are not redone test after test ---------------

@pytest.fixture(scope="session", autouse=True)
def build_step_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Within this pytest process, ``build_library`` compiles the native runtime once (per
    compiler and source text) and emits each kernel's object code once (per LLVM IR text and
    host target): both are pure, so later builds get the same bytes. Library link, loading and
    running are untouched; builds in child processes (the CLI, live servers) compile as usual."""
    try:
        from tuner_service.compiler.deploy import library
    except ImportError:  # a light install without the compiler's extras
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(library, "emit_object", _memo_emit_object(library.emit_object))
        patch.setattr(library, "compile_runtime", _memo_compile_runtime(
            library.compile_runtime, tmp_path_factory.mktemp("native-runtime")))
        yield


def _memo_emit_object(emit: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    from schedule_templates.codegen.llvm_jit import host_features

    objects: dict[tuple[str, str], bytes] = {}

    def emit_object(module: Any) -> bytes:
        key = (str(module), host_features())
        if key not in objects:
            objects[key] = emit(module)
        return objects[key]

    return emit_object


def _memo_compile_runtime(compile_runtime: Callable[[str, Path], Path], store: Path
                          ) -> Callable[[str, Path], Path]:
    from tuner_service.compiler.deploy.native_build import RUNTIME_SOURCE

    built: dict[tuple[str, str], Path] = {}

    def compile_once(compiler: str, directory: Path) -> Path:
        key = (compiler, hashlib.sha256(RUNTIME_SOURCE.read_bytes()).hexdigest())
        if key not in built:
            own = store / str(len(built))
            own.mkdir()
            built[key] = compile_runtime(compiler, own)
        target = directory / built[key].name
        shutil.copyfile(built[key], target)
        return target

    return compile_once


PG_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=3"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


class ProcessLock:
    """A file lock that holds across pytest processes (``-n`` workers, parallel runs):
    ``shared()`` beside others, ``alone()`` while no other process holds it. A waiting
    ``alone()`` closes a gate, so new ``shared()`` users queue behind it instead of starving it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.gate = path.with_suffix(".gate")
        self._fd: int | None = None
        self._users = 0

    @contextmanager
    def _through_gate(self) -> Iterator[None]:
        gate = os.open(self.gate, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(gate, fcntl.LOCK_EX)
            yield
        finally:
            os.close(gate)

    @contextmanager
    def shared(self) -> Iterator[None]:
        if self._users == 0:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            with self._through_gate():
                fcntl.flock(fd, fcntl.LOCK_SH)
            self._fd = fd
        self._users += 1
        try:
            yield
        finally:
            self._users -= 1
            if self._users == 0 and self._fd is not None:
                os.close(self._fd)  # releases the lock
                self._fd = None

    @contextmanager
    def alone(self) -> Iterator[None]:
        """Waits until no other process holds the lock (this one's own use goes on)."""
        with self.shared():
            assert self._fd is not None
            with self._through_gate():
                fcntl.flock(self._fd, fcntl.LOCK_EX)  # drops the shared lock, then waits
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_SH)


def _lock_path(name: str) -> Path:
    return Path(tempfile.gettempdir()) / f"tuner-tests-{name}.lock"


@pytest.fixture(scope="session")
def postgres_lock() -> ProcessLock:
    """Held shared while a test uses the shared PostgreSQL, alone while one restarts it."""
    return ProcessLock(_lock_path("postgresql"))


@pytest.fixture(scope="session")
def machine_lock() -> ProcessLock:
    return ProcessLock(_lock_path("machine"))


@pytest.fixture(autouse=True)
def _alone_when_marked(request: pytest.FixtureRequest, machine_lock: ProcessLock
                       ) -> Iterator[None]:
    """A test marked ``alone`` (its point is latency or a race under its own load) runs while
    no test of another pytest process runs; every other test runs beside others."""
    hold = machine_lock.alone if request.node.get_closest_marker("alone") else machine_lock.shared
    with hold():
        yield


@pytest.fixture(scope="session")
def postgres_available(postgres_lock: ProcessLock) -> str:
    """Empty string when PostgreSQL answers, else the reason it does not."""
    try:
        import psycopg

        with postgres_lock.shared(), psycopg.connect(PG_DSN) as conn:
            conn.execute("SELECT 1")
    except Exception as e:  # any failure means: skip the PostgreSQL half
        return f"PostgreSQL at 127.0.0.1:5432/test unreachable: {e}"
    return ""


def _postgres_schema_url(reason: str, lock: ProcessLock) -> Iterator[str]:
    if reason:
        pytest.skip(reason)
    import psycopg

    schema = f"tuner_test_{uuid.uuid4().hex[:12]}"
    with lock.shared():
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        try:
            yield f"{PG_URL}?options=-csearch_path%3D{schema}"
        finally:
            with psycopg.connect(PG_DSN, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path, postgres_available: str,
                 postgres_lock: ProcessLock) -> Iterator[str]:
    """An empty database (no tables): SQLite file or a private PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'tuner.db'}"
    else:
        yield from _postgres_schema_url(postgres_available, postgres_lock)


@pytest.fixture
def migrated_url(database_url: str) -> str:
    """``database_url`` upgraded to the migration head."""
    from tuner_service.db.migrate import upgrade

    upgrade(database_url)
    return database_url


# -- a server on the migrated database (tests/server, tests/dashboard) ---------------------

@pytest.fixture
def settings(migrated_url: str, tmp_path: Path) -> Settings:
    from tuner_service.settings import Settings

    return Settings(
        database_url=migrated_url, data_dir=tmp_path / "data", lease_s=30.0,
        heartbeat_s=5.0, driver_interval_s=0.05, driver_lease_s=5.0, batch_size=4,
        queue_depth=8, claim_max_wait_s=2.0,
    )


@pytest.fixture
def make_client() -> Iterator[Callable[[Settings], TestClient]]:
    """Start apps (lifespan included) and stop them at the end of the test."""
    from fastapi.testclient import TestClient

    from tuner_service.app import create_app

    opened: list[TestClient] = []

    def make(settings: Settings) -> TestClient:
        client = TestClient(create_app(settings))
        client.__enter__()
        opened.append(client)
        return client

    yield make
    for client in reversed(opened):
        client.__exit__(None, None, None)


@pytest.fixture
def client(settings: Settings, make_client: Callable[[Settings], TestClient]) -> TestClient:
    return make_client(settings)


@pytest.fixture
def tokens(settings: Settings) -> dict[str, str]:
    """A secret per role, stored in the test database."""
    from tuner_service import auth
    from tuner_service.db.engine import Database

    db = Database(settings.resolved_database_url)
    try:
        with db.session() as session:
            return {role: auth.create_token(session, role, f"test-{role}")[1]
                    for role in auth.ROLES}
    finally:
        db.dispose()
