"""A real worker against the real server on loopback (SQLite, uvicorn, Alembic migrations).

Skips where the server's dependencies are not installed (a worker-only install).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("tuner_service.api.app", reason="the server is not built yet")

import uvicorn

from workers.agent import run_worker
from workers.settings import WorkerSettings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOKEN = "e2e-admin-token-0123456789abcdef"
DEVICE = "e2e-cpu"
WORKLOAD = "dense:M=64,N=64,K=64"


class LiveServer:
    """The service on a fixed loopback port; can be stopped and started again on the same
    database."""

    def __init__(self, data_dir: Path) -> None:
        from tuner_service.db.migrate import upgrade

        self.url_db = f"sqlite:///{data_dir / 'tuner.sqlite'}"
        upgrade(self.url_db)
        self.data_dir = data_dir
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        from pydantic import SecretStr

        from tuner_service.app import create_app
        from tuner_service.settings import Settings

        settings = Settings(
            data_dir=self.data_dir, database_url=self.url_db, bootstrap_token=SecretStr(TOKEN),
            lease_s=20.0, heartbeat_s=1.0, driver_interval_s=0.1, batch_size=4,
            queue_depth=4, measure_repeat=2, measure_min_repeat_ms=2.0, build_timeout_s=30.0,
            run_timeout_s=30.0)
        config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=self.port,
                                log_level="warning", lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)

    def stop(self) -> None:
        assert self._server is not None and self._thread is not None
        self._server.should_exit = True
        self._thread.join(30)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = httpx.request(method, f"{self.url}/api/v1{path}", timeout=30,
                                 headers={"Authorization": f"Bearer {TOKEN}"}, **kwargs)
        response.raise_for_status()
        return response.json()

    def submit(self, trials: int, workload: str = WORKLOAD) -> int:
        body = {"workloads": [workload], "target": "llvm", "device_key": DEVICE,
                "trials_per_task": trials, "tuner": "random"}
        return int(self.call("POST", "/jobs", json=body)["job_id"])

    def trials_done(self, job_id: int) -> int:
        return sum(t["trials_done"] for t in self.call("GET", f"/jobs/{job_id}")["tasks"])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path)
    live.start()
    try:
        yield live
    finally:
        live.stop()


def worker_settings(server: LiveServer, tmp_path: Path, **overrides: Any) -> WorkerSettings:
    values: dict[str, Any] = {
        "server": server.url, "token": TOKEN, "device_key": DEVICE, "backend": "fake",
        "spool_dir": tmp_path / "spool", "max_idle_s": 3.0, "poll_s": 0.5, "max_items": 4,
        "shutdown_flush_s": 2.0, "backoff_cap_s": 1.0,
    }
    return WorkerSettings(**{**values, **overrides})


def wait_for(predicate: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_fake_worker_finishes_a_job(server: LiveServer, tmp_path: Path) -> None:
    job_id = server.submit(trials=12)
    assert run_worker(worker_settings(server, tmp_path)) == 0
    assert server.trials_done(job_id) == 12
    workers = server.call("GET", "/workers")
    assert workers[0]["device_key"] == DEVICE and workers[0]["hardware"]["logical_cores"] >= 1


def test_an_llvm_worker_measures_real_kernels(server: LiveServer, tmp_path: Path) -> None:
    pytest.importorskip("schedule_templates.runtime")
    job_id = server.submit(trials=6)
    assert run_worker(worker_settings(server, tmp_path, backend="llvm",
                                      parallel_build=2)) == 0
    job = server.call("GET", f"/jobs/{job_id}")
    assert sum(t["trials_done"] for t in job["tasks"]) == 6
    assert job["tasks"][0]["best_gflops"] > 0


def test_stopping_the_server_mid_batch_loses_no_result(server: LiveServer, tmp_path: Path
                                                       ) -> None:
    job_id = server.submit(trials=12)
    settings = worker_settings(server, tmp_path, max_idle_s=4.0,
                               backend_options={"run_s": 0.3})
    worker = threading.Thread(target=run_worker, args=(settings,))
    worker.start()
    spool = tmp_path / "spool" / "results.jsonl"
    wait_for(lambda: server.trials_done(job_id) >= 2)
    server.stop()
    # The worker finishes its batch and keeps what it cannot report in the spool.
    wait_for(lambda: spool.exists() and spool.read_text().strip() != "", timeout_s=20)
    server.start()
    worker.join(120)
    assert not worker.is_alive()
    assert server.trials_done(job_id) == 12
    assert not (tmp_path / "spool" / "results.jsonl").read_text().strip()
