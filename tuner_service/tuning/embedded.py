"""The embedded one-machine service: SQLite in a data directory, the server in a thread of this
process, local CPU workers as subprocesses. ``tuner up``, ``tuner tune MODEL.onnx`` and the
Python API's ``tune`` run their jobs on it, with the same job machinery as a shared server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tuner_service.errors import TunerServiceError

logger = logging.getLogger(__name__)

DEVICE_KEY = "local"


class EmbeddedError(TunerServiceError):
    """The embedded service could not start (the message says why)."""


@dataclasses.dataclass(frozen=True)
class LocalWorkers:
    """How many local workers to start and how they measure."""

    count: int = 1
    #: threads per timed run (None: all cores)
    threads: int | None = None
    #: candidates compiled at once per worker; timed runs never overlap with each other
    parallel_build: int = 1
    verbose: bool = False
    #: exit after this many seconds without work (None: never), so a worker whose parent was
    #: killed outright does not poll a dead server forever
    max_idle_s: float | None = None


@dataclasses.dataclass(frozen=True)
class LocalService:
    url: str
    token: str  # admin
    worker_token: str
    database_url: str
    worker_logs: tuple[Path, ...]


def free_port(host: str, wanted: int) -> int:
    """``wanted`` when it is free, else (or for 0) a free port the system picks."""
    with socket.socket() as sock:
        try:
            sock.bind((host, wanted))
        except OSError:
            sock.bind((host, 0))
        return int(sock.getsockname()[1])


def embedded_tokens(settings: Any) -> dict[str, str]:
    """Reuse the saved admin/worker tokens when the database still knows them."""
    from tuner_service import auth
    from tuner_service.db.engine import Database

    path: Path = settings.client_file
    saved: dict[str, str] = {}
    if path.exists():
        with contextlib.suppress(ValueError):
            saved = json.loads(path.read_text())
    db = Database(settings.resolved_database_url)
    try:
        with db.session() as session:
            tokens = {}
            for key, role in (("token", "admin"), ("worker_token", "worker")):
                secret = saved.get(key)
                if not secret or auth.authenticate(session, secret) is None:
                    secret = auth.create_token(session, role, f"embedded ({role})")[1]
                tokens[key] = secret
    finally:
        db.dispose()
    return tokens


def save_client_file(settings: Any, server_url: str, tokens: dict[str, str]) -> None:
    path: Path = settings.client_file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"server_url": server_url, **tokens}, indent=2))
    path.chmod(0o600)


@contextlib.contextmanager
def server_thread(settings: Any) -> Iterator[str]:
    import uvicorn

    from tuner_service.app import create_app

    config = uvicorn.Config(create_app(settings), host=settings.host, port=settings.port,
                            log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise EmbeddedError("the embedded server did not start; see the log above")
        time.sleep(0.05)
    try:
        yield f"http://{settings.host}:{settings.port}"
    finally:
        server.should_exit = True
        thread.join(15)


def _worker_command(url: str, token: str, workers: LocalWorkers, name: str, spool: Path
                    ) -> list[str]:
    command = [sys.executable, "-m", "tuner_service.cli.main"]
    if workers.verbose:
        command.append("-v")
    command += ["worker", "--server", url, "--token", token, "--device-key", DEVICE_KEY,
                "--target", "llvm", "--name", name, "--parallel-build",
                str(workers.parallel_build), "--spool-dir", str(spool)]
    if workers.threads:
        command += ["--threads", str(workers.threads)]
    if workers.max_idle_s is not None:
        command += ["--max-idle-s", str(workers.max_idle_s)]
    return command


@contextlib.contextmanager
def worker_processes(url: str, token: str, workers: LocalWorkers, log_dir: Path
                     ) -> Iterator[list[Path]]:
    """Start ``workers.count`` local ``tuner worker`` processes; stop them on exit.

    Each keeps its unreported results in a spool of its own under ``log_dir``: the default
    spool (~/.tuner/spool) would collide with any other worker on this machine."""
    log_dir.mkdir(parents=True, exist_ok=True)
    processes: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        for n in range(workers.count):
            log_path = log_dir / f"worker-{n + 1}.log"
            with log_path.open("ab") as log:
                # a session of its own: Ctrl-C in the terminal reaches only us, and we stop the
                # worker with SIGTERM, which lets it report what it measured first
                processes.append(subprocess.Popen(
                    _worker_command(url, token, workers, f"local-{n + 1}",
                                    log_dir / "spool" / f"worker-{n + 1}"), stdout=log,
                    stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                    start_new_session=True))
            logs.append(log_path)
        yield logs
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextlib.contextmanager
def local_service(settings: Any, workers: LocalWorkers | None) -> Iterator[LocalService]:
    """Migrate the database, start the server thread and the workers; stop all on exit.

    ``settings`` names the data directory and the port (0 or a busy port: any free one)."""
    from tuner_service.db.migrate import upgrade

    settings = settings.with_overrides(port=free_port(settings.host, settings.port))
    url = settings.resolved_database_url
    upgrade(url)
    tokens = embedded_tokens(settings)
    with server_thread(settings) as server_url:
        save_client_file(settings, server_url, tokens)
        with contextlib.ExitStack() as stack:
            logs: list[Path] = []
            if workers is not None and workers.count > 0:
                logs = stack.enter_context(worker_processes(
                    server_url, tokens["worker_token"], workers, settings.data_dir))
            yield LocalService(server_url, tokens["token"], tokens["worker_token"], url,
                               tuple(logs))
