"""Live processes for the reliability tests: the server (``tuner serve``) and workers, each its
own process group on loopback, so a test can SIGKILL one the way a crash or a power cut would.

Run as a script (``python rel_live.py worker '<json settings>'``) it is a worker process with
any ``WorkerSettings`` (the CLI does not expose every knob, e.g. the backoff cap).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "rel-admin-token-0123456789abcdef0123"
DEVICE = "rel-cpu"
PG_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=3"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any TUNER_* setting of the caller, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    env.update({"OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}, **extra)
    return env


def postgres_reason() -> str:
    """Empty when the PostgreSQL at 127.0.0.1:5432/test answers, else why not."""
    try:
        import psycopg

        with psycopg.connect(PG_DSN) as conn:
            conn.execute("SELECT 1")
    except Exception as e:  # any failure means: skip
        return f"PostgreSQL at 127.0.0.1:5432/test unreachable: {e}"
    return ""


@contextmanager
def postgres_schema(prefix: str = "tuner_rel") -> Iterator[str]:
    """A private, migrated schema in the test database; dropped afterwards."""
    import uuid

    import psycopg

    from tuner_service.db.migrate import upgrade

    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        url = f"{PG_URL}?options=-csearch_path%3D{schema}"
        upgrade(url)
        yield url
    finally:
        _drop_schema(schema)


def _drop_schema(schema: str, attempts: int = 5) -> None:
    """Drop a test schema; a server of the test may still be stopping (pytest tears fixtures
    down in reverse order), so a deadlock with its last transaction is retried."""
    import time

    import psycopg

    for attempt in range(attempts):
        try:
            with psycopg.connect(PG_DSN, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            return
        except psycopg.errors.DeadlockDetected:
            if attempt + 1 == attempts:
                raise
            time.sleep(0.5)


def create_tokens(database_url: str) -> dict[str, str]:
    """A user and a worker token (the admin one is the bootstrap token)."""
    from tuner_service import auth
    from tuner_service.db.engine import Database

    db = Database(database_url)
    try:
        with db.session() as session:
            tokens = {r: auth.create_token(session, r, f"rel-{r}")[1] for r in ("user", "worker")}
    finally:
        db.dispose()
    return {"admin": ADMIN, **tokens}


class Process:
    """A child in its own process group (so a kill takes its measuring children with it)."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.argv, self.env, self.log = argv, env, log
        self.proc: subprocess.Popen[bytes] | None = None

    def spawn(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, cwd=ROOT, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole group: no handler runs, nothing is flushed or released."""
        if self.proc is None:
            return
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited in time; the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        # whatever the group left behind (measuring children) goes too
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.returncode

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


class LiveServer(Process):
    """``tuner serve`` on a loopback port; ``settings`` become TUNER_* variables."""

    def __init__(self, database_url: str, workdir: Path, **settings: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.database_url = database_url
        values = {"bootstrap_token": ADMIN, "data_dir": str(workdir / "data"),
                  "driver_interval_s": 0.1, **settings}
        env = clean_env(**{f"TUNER_{k.upper()}": str(v) for k, v in values.items()})
        argv = [sys.executable, "-m", "tuner_service.cli.main", "serve", "--database",
                database_url, "--port", str(self.port)]
        super().__init__(argv, env, workdir / f"server-{self.port}.log")

    def start(self, timeout_s: float = 60.0) -> LiveServer:
        self.spawn()
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.alive, f"the server exited:\n{self.tail()}"
            try:
                if httpx.get(f"{self.url}/api/v1/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"the server did not start:\n{self.tail()}"
            time.sleep(0.1)

    def request(self, method: str, path: str, token: str | None = ADMIN,
                **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.request(method, f"{self.url}/api/v1{path}", headers=headers,
                             timeout=30, **kwargs)

    def call(self, method: str, path: str, token: str | None = ADMIN, **kwargs: Any) -> Any:
        response = self.request(method, path, token, **kwargs)
        assert response.status_code < 300, f"{method} {path}: {response.status_code} " \
                                            f"{response.text[:500]}"
        return response.json()

    def submit(self, workloads: list[str], trials: int, token: str = ADMIN,
               **extra: Any) -> int:
        body = {"workloads": workloads, "target": "llvm", "device_key": DEVICE,
                "trials_per_task": trials, "tuner": "random", **extra}
        return int(self.call("POST", "/jobs", token, json=body)["job_id"])

    def job(self, job_id: int) -> dict[str, Any]:
        answer: dict[str, Any] = self.call("GET", f"/jobs/{job_id}")
        return answer

    def wait_job(self, job_id: int, timeout_s: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                job = self.job(job_id)
                if job["status"] in ("done", "failed", "cancelled"):
                    return job
            except httpx.TransportError:
                pass  # a restart in progress
            assert time.monotonic() < deadline, f"job {job_id} unfinished:\n{self.tail()}"
            time.sleep(0.2)


class LiveWorker(Process):
    """A worker process (``run_worker``) with the fake backend unless told otherwise."""

    def __init__(self, server: LiveServer, workdir: Path, name: str, **settings: Any) -> None:
        values = {"server": server.url, "token": ADMIN, "device_key": DEVICE,
                  "backend": "fake", "spool_dir": str(workdir / f"spool-{name}"),
                  "poll_s": 0.5, "max_items": 4, "backoff_cap_s": 0.5,
                  "shutdown_flush_s": 5.0, "request_timeout_s": 10.0, "name": name,
                  **settings}
        argv = [sys.executable, str(Path(__file__).resolve()), "worker", json.dumps(values)]
        super().__init__(argv, clean_env(), workdir / f"worker-{name}.log")

    def start(self) -> LiveWorker:
        self.spawn()
        return self


def wait_until(predicate: Any, timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _worker_main(raw: str) -> int:
    import logging

    from workers.agent import run_worker
    from workers.settings import WorkerSettings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    values = json.loads(raw)
    values["spool_dir"] = Path(values["spool_dir"])
    return run_worker(WorkerSettings(**values))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "worker":
        sys.exit(_worker_main(sys.argv[2]))
    sys.exit("usage: rel_live.py worker '<WorkerSettings as JSON>'")
