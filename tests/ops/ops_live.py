"""Helpers for the operations tests: a live server on loopback (uvicorn in a thread) with
bootstrap tokens, and worker processes started through the real ``tuner worker`` command."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ADMIN_TOKEN = "ops-admin-token-0123456789abcdef"
WORKER_TOKEN = "ops-worker-token-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(predicate: Callable[[], Any], timeout_s: float = 60.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what or predicate}"
        time.sleep(0.1)


class LiveServer:
    """The service on a free loopback port, on a migrated database."""

    def __init__(self, database_url: str, data_dir: Path, **overrides: Any) -> None:
        import uvicorn
        from pydantic import SecretStr

        from tuner_service.app import create_app
        from tuner_service.settings import Settings

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        values: dict[str, Any] = {
            "database_url": database_url, "data_dir": data_dir,
            "bootstrap_token": SecretStr(ADMIN_TOKEN),
            "bootstrap_worker_token": SecretStr(WORKER_TOKEN), "heartbeat_s": 1.0,
            "lease_s": 20.0, "driver_interval_s": 0.05, "batch_size": 4, "queue_depth": 8,
            "claim_max_wait_s": 1.0, "measure_repeat": 2, "measure_min_repeat_ms": 1.0,
            **overrides,
        }
        self.settings = Settings(**values)
        self.app = create_app(self.settings)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def start(self) -> None:
        self._thread.start()
        wait_until(lambda: self._server.started or not self._thread.is_alive(), 30, "start")
        assert self._server.started, "the server did not start"

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(30)

    def call(self, method: str, path: str, token: str | None = ADMIN_TOKEN, **kwargs: Any
             ) -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        answer = httpx.request(method, f"{self.url}{path}", headers=headers, timeout=30,
                               **kwargs)
        assert answer.status_code < 400, f"{method} {path}: {answer.status_code} {answer.text}"
        if answer.headers.get("content-type", "").startswith("application/json"):
            return answer.json()
        return answer.text


class WorkerProcesses:
    """``tuner worker`` subprocesses, stopped with SIGTERM (the worker's clean stop)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, server: str, device_key: str, target: str = "llvm",
              *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        index = len(self.processes)
        log = (self.tmp_path / f"worker-{index}.log").open("wb")
        command = [sys.executable, "-m", "tuner_service.cli.main", "worker", "--server", server,
                   "--token", WORKER_TOKEN, "--device-key", device_key, "--target", target,
                   "--spool-dir", str(self.tmp_path / f"spool-{index}"), "--poll-s", "0.5",
                   *extra]
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        self.processes.append(process)
        return process

    def log(self, index: int) -> str:
        return (self.tmp_path / f"worker-{index}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
