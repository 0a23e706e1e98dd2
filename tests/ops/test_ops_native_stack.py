"""The compose stack without Docker: the server and CPU worker commands and environments taken
from docker-compose.yml, run natively against the PostgreSQL on 127.0.0.1 (a fresh schema), and
a small job measured end to end by the real LLVM worker.

Only what cannot exist outside compose is rewritten: the database URL (``db:5432`` -> the local
test database), the server's address (``server:8000`` -> a free loopback port) and HOME (where
the worker's spool volume would be mounted).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from ops_compose import commands, environment, interpolate, load_compose
from ops_live import free_port, wait_until
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(300)]

PG_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=3"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DOT_ENV = {
    "POSTGRES_PASSWORD": "5b0c2d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a",
    "TUNER_BOOTSTRAP_TOKEN": "native-admin-7c1e9b3d5f7a9c1e3b5d7f9a1c3e5b7d",
    "TUNER_WORKER_TOKEN": "native-worker-2d4f6a8c0e2b4d6f8a0c2e4b6d8f0a2c",
}
WORKLOAD = "dense:M=64,N=64,K=64"


@pytest.fixture
def pg_schema_url(postgres_available: str, postgres_lock: Any) -> Iterator[str]:
    """An empty private schema in the test database (the server's command migrates it)."""
    if postgres_available:
        pytest.skip(postgres_available)
    import psycopg

    schema = f"tuner_stack_{uuid.uuid4().hex[:12]}"
    with postgres_lock.shared():  # tests/conftest.py: no restart of the server meanwhile
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        try:
            yield f"{PG_URL}?options=-csearch_path%3D{schema}"
        finally:
            with psycopg.connect(PG_DSN, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def start(service: dict[str, Any], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Run the service's own command line (``sh -c`` included) with its environment."""
    command = service["command"]
    bin_dir = str(Path(sys.executable).parent)  # where `tuner` is installed
    full_env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
                "PYTHONUNBUFFERED": "1", **env}
    # logs go to stderr; stdout carries command output (``database at revision ...``)
    with log.open("wb") as err, log.with_suffix(".out").open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=err, env=full_env)


def stop(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        process.terminate()
    try:
        return process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def json_log(path: Path) -> list[dict[str, Any]]:
    """Every line of a process's stderr, each of which must be a JSON object."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return [json.loads(line) for line in lines]


def test_the_compose_commands_run_a_job_natively(pg_schema_url: str, tmp_path: Path) -> None:
    services = interpolate(load_compose()["services"], DOT_ENV)
    server_env = environment(services["server"])
    assert urlsplit(server_env["TUNER_DATABASE_URL"]).hostname == "db"
    port = free_port()
    server_env.update(TUNER_DATABASE_URL=pg_schema_url, TUNER_HOST="127.0.0.1",
                      TUNER_PORT=str(port), TUNER_DATA_DIR=str(tmp_path / "data"))
    url = f"http://127.0.0.1:{port}"
    worker_env = environment(services["worker-cpu"])
    assert urlsplit(worker_env["TUNER_SERVER"]).hostname == "server"
    worker_env.update(TUNER_SERVER=url, HOME=str(tmp_path / "home"))
    [worker_command] = commands(services["worker-cpu"])
    device_key = worker_command[worker_command.index("--device-key") + 1]
    admin = {"Authorization": f"Bearer {DOT_ENV['TUNER_BOOTSTRAP_TOKEN']}"}

    server = start(services["server"], server_env, tmp_path / "server.log")
    worker = None
    try:
        def healthy() -> bool:
            try:
                return httpx.get(f"{url}/api/v1/health", timeout=5).json()["status"] == "ok"
            except httpx.HTTPError:
                assert server.poll() is None, (tmp_path / "server.log").read_text()
                return False
        wait_until(healthy, 120, "the server to migrate and serve")
        worker = start(services["worker-cpu"], worker_env, tmp_path / "worker.log")

        # the worker token from the environment is a worker, not an admin
        refused = httpx.post(f"{url}/api/v1/jobs", timeout=30, json={"workloads": [WORKLOAD]},
                             headers={"Authorization": f"Bearer {worker_env['TUNER_TOKEN']}"})
        assert refused.status_code == 403
        answer = httpx.post(f"{url}/api/v1/jobs", headers=admin, timeout=30, json={
            "workloads": [WORKLOAD], "target": "llvm", "device_key": device_key,
            "trials_per_task": 4, "tuner": "random"})
        assert answer.status_code == 201, answer.text
        job_id = answer.json()["job_id"]

        def finished() -> dict[str, Any] | None:
            assert worker is not None and worker.poll() is None, \
                (tmp_path / "worker.log").read_text()
            job: dict[str, Any] = httpx.get(f"{url}/api/v1/jobs/{job_id}", timeout=30).json()
            return job if job["status"] in ("done", "failed", "cancelled") else None
        job = wait_until(finished, 240, f"job {job_id}")
        assert job["status"] == "done", job
        [task] = job["tasks"]
        assert task["trials_done"] == 4 and task["best_gflops"] > 0

        workers = httpx.get(f"{url}/api/v1/workers", timeout=30).json()
        assert [(w["device_key"], w["online"]) for w in workers] == [(device_key, True)]
        best = httpx.get(f"{url}/api/v1/best", params={"workload": WORKLOAD}, timeout=30).json()
        assert best["device_key"] == device_key and best["gflops"] > 0

        metrics = httpx.get(f"{url}/metrics", timeout=30).text
        stored = sum(s.value for f in text_string_to_metric_families(metrics)
                     for s in f.samples if s.name == "tuner_measurement_results_total")
        # every stored result is counted: the 4 trials and the re-measurements of the best
        records = httpx.get(f"{url}/api/v1/records", params={"workload": WORKLOAD},
                            headers=admin, timeout=30).text.splitlines()
        purposes = [json.loads(line)["purpose"] for line in records]
        assert purposes.count("tune") == 4 and stored == len(purposes)
    finally:
        worker_code = stop(worker) if worker is not None else None
        stop(server)
    assert worker_code == 0  # SIGTERM: the worker finished cleanly
    # TUNER_LOG_FORMAT=json in the compose file: both processes log JSON lines
    assert any(e["logger"] == "uvicorn.access" for e in json_log(tmp_path / "server.log"))
    assert any(e["logger"].startswith("workers") for e in json_log(tmp_path / "worker.log"))
