"""``tuner serve --no-access-log`` (or ``TUNER_ACCESS_LOG=false``) keeps uvicorn's per-request
lines out of the log, in text and JSON mode alike; the server's own lines stay."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from ops_live import free_port, wait_until

TUNER = [sys.executable, "-m", "tuner_service.cli.main"]


def _serve_once(tmp_path: Path, args: list[str], env: dict[str, str]) -> str:
    """Start ``tuner serve``, answer one health check, stop; its log."""
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    subprocess.run([*TUNER, "db", "upgrade", "--database", url], check=True,
                   capture_output=True, timeout=120)
    port = free_port()
    log = tmp_path / "server.log"
    env = {**os.environ, "TUNER_DATABASE_URL": url, "TUNER_PORT": str(port),
           "TUNER_DATA_DIR": str(tmp_path), **env}
    with log.open("wb") as out:
        server = subprocess.Popen([*TUNER, "serve", *args], stdout=out,
                                  stderr=subprocess.STDOUT, env=env)
    try:
        def healthy() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/api/v1/health").status_code == 200
            except httpx.HTTPError:
                return server.poll() is not None
        wait_until(healthy, 60, "the server")
        assert server.poll() is None, log.read_text()
    finally:
        server.terminate()
        server.wait(30)
    return log.read_text()


@pytest.mark.slow
@pytest.mark.parametrize(("args", "env"), [
    (["--no-access-log"], {"TUNER_LOG_FORMAT": "json"}),
    ([], {"TUNER_ACCESS_LOG": "false"}),
], ids=["flag-json", "env-text"])
def test_the_access_log_can_be_turned_off(tmp_path: Path, args: list[str],
                                          env: dict[str, str]) -> None:
    text = _serve_once(tmp_path, args, env)
    assert "startup complete" in text  # the server's own lines are still there
    assert "GET /api/v1/health" not in text and "uvicorn.access" not in text


@pytest.mark.slow
def test_the_flag_wins_over_the_environment(tmp_path: Path) -> None:
    text = _serve_once(tmp_path, ["--access-log"], {"TUNER_ACCESS_LOG": "false"})
    assert "GET /api/v1/health" in text
