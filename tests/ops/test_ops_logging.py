"""Structured logs: ``TUNER_LOG_FORMAT=json`` makes every stderr line of a ``tuner`` process one
JSON object (the server's own lines and uvicorn's access log included)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from ops_live import free_port, wait_until

from tuner_service.logging_setup import JsonFormatter, configure, resolve_format

TUNER = [sys.executable, "-m", "tuner_service.cli.main"]


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every non-empty line as JSON (fails on the first line that is not)."""
    out = []
    for line in text.splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError:
                pytest.fail(f"not a JSON log line: {line!r}")
    return out


def test_a_record_becomes_one_json_object_with_its_extras() -> None:
    logger = logging.getLogger("tuner_service.test")
    record = logger.makeRecord(logger.name, logging.WARNING, __file__, 1,
                               "job %d: %s", (7, "slow\nworker"), None,
                               extra={"job_id": 7, "device_key": "epyc"})
    try:
        raise ValueError("boom")
    except ValueError:
        record.exc_info = sys.exc_info()
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "job 7: slow\nworker"
    assert entry["level"] == "warning" and entry["logger"] == "tuner_service.test"
    assert entry["job_id"] == 7 and entry["device_key"] == "epyc"
    assert entry["exc_type"] == "ValueError" and "boom" in entry["exc"]
    assert entry["ts"].endswith("+00:00") and entry["pid"] == os.getpid()


def test_the_flag_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUNER_LOG_FORMAT", raising=False)
    assert resolve_format(None) == "text"
    monkeypatch.setenv("TUNER_LOG_FORMAT", "JSON")
    assert resolve_format(None) == "json"
    assert resolve_format("text") == "text"
    monkeypatch.setenv("TUNER_LOG_FORMAT", "xml")
    with pytest.raises(ValueError, match="TUNER_LOG_FORMAT"):
        resolve_format(None)


def test_configure_leaves_a_root_logger_someone_else_equipped() -> None:
    # pytest's capture handler is on the root logger during a test
    assert logging.getLogger().handlers
    assert configure("json") is False


def test_a_bad_format_is_refused_before_the_command_runs() -> None:
    done = subprocess.run([*TUNER, "space", "dense:M=8,N=8,K=8"], capture_output=True, text=True,
                          env={**os.environ, "TUNER_LOG_FORMAT": "xml"}, timeout=120)
    assert done.returncode == 2
    assert "TUNER_LOG_FORMAT must be one of text, json" in done.stderr


@pytest.mark.slow
def test_cli_commands_log_json_lines(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    done = subprocess.run([*TUNER, "--log-format", "json", "-v", "db", "upgrade",
                           "--database", url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = json_lines(done.stderr)
    assert any(e["logger"].startswith("alembic") for e in lines)
    assert "database at revision" in done.stdout


@pytest.mark.slow
def test_the_server_and_its_access_log_write_json(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    subprocess.run([*TUNER, "db", "upgrade", "--database", url], check=True,
                   capture_output=True, timeout=120)
    port = free_port()
    log = tmp_path / "server.log"
    env = {**os.environ, "TUNER_LOG_FORMAT": "json", "TUNER_DATABASE_URL": url,
           "TUNER_PORT": str(port), "TUNER_DATA_DIR": str(tmp_path)}
    with log.open("wb") as out:
        server = subprocess.Popen([*TUNER, "serve"], stdout=out, stderr=subprocess.STDOUT,
                                  env=env)
    try:
        def healthy() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/api/v1/health").status_code == 200
            except httpx.HTTPError:
                return server.poll() is not None  # stop waiting when it died
        wait_until(healthy, 60, "the server")
        assert server.poll() is None, log.read_text()
    finally:
        server.terminate()
        server.wait(30)
    lines = json_lines(log.read_text())
    access = [e for e in lines if e["logger"] == "uvicorn.access"]
    assert any("/api/v1/health" in e["message"] and "200" in e["message"] for e in access)
    assert any("startup complete" in e["message"] for e in lines)
