"""``tuner submit --wait`` says why a job does not move (no worker online) instead of waiting in
silence, and ends when the job does."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx

from tests.cli.conftest import TUNER
from tuner_service.tuning.embedded import LocalService


def test_submit_wait_reports_no_worker(small_model: Path, server: LocalService) -> None:
    process = subprocess.Popen(
        [*TUNER, "submit", str(small_model), "--wait", "--trials-per-task", "2", "--server",
         server.url, "--token", server.token], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "HOME": str(small_model.parent)})
    assert process.stdout is not None
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "note: no worker online" in line:
            break
    assert any("note: no worker online for target 'llvm'" in line for line in lines), lines
    job_id = int(next(line for line in lines if line.startswith("job ")).split()[1].rstrip(":"))
    answer = httpx.post(f"{server.url}/api/v1/jobs/{job_id}/cancel",
                        headers={"Authorization": f"Bearer {server.token}"})
    assert answer.status_code == 200, answer.text
    rest, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stderr  # the job did not finish
    assert f"job {job_id}: cancelled" in rest
