"""``tuner tune MODEL.onnx``: a real job on the embedded service with a real local worker; it
writes configs and records, pushes them to a server, resumes when interrupted, and reuses a
finished job instead of measuring again."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.cli.conftest import TUNER, run_tuner
from tuner_service.settings import Settings
from tuner_service.tuning.embedded import LocalService, local_service

pytestmark = pytest.mark.slow


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[LocalService]:
    """A second server (no workers) to push records to."""
    data = tmp_path / "remote"
    settings = Settings(data_dir=data, database_url=f"sqlite:///{data / 'tuner.db'}", port=0)
    with local_service(settings, workers=None) as service:
        yield service


def _tune(model: Path, out: Path, *extra: str, env: dict[str, str] | None = None) -> dict:
    done = run_tuner(["tune", str(model), "-o", str(out), "--json", *extra], model.parent,
                     env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_model_is_tuned_pushed_and_reused(small_model: Path, remote: LocalService) -> None:
    out = small_model.parent / "out"
    report = _tune(small_model, out, "--trials", "2", "--push", remote.url, "--token",
                   remote.token)
    assert report["status"] == "done" and report["origin"] == "new"
    assert [t["trials_done"] for t in report["tasks"]] == [2, 2]
    configs = json.loads((out / "configs.json").read_text())
    assert all(task["config"] is not None for task in configs["tasks"])
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) >= 4
    assert report["pushed"]["imported"] == len(records)
    pushed = httpx.get(f"{remote.url}/api/v1/records",
                       headers={"Authorization": f"Bearer {remote.token}"}).text
    assert {r["uid"] for r in records} <= {json.loads(line)["uid"]
                                           for line in pushed.splitlines()}

    # the upload limit guards a shared server: the embedded one takes the user's own model
    # whatever its size (BERT-base is 440 MB against a 100 MiB default)
    again = _tune(small_model, out, "--trials", "2",
                  env={"TUNER_MAX_UPLOAD_BYTES": str(small_model.stat().st_size // 2)})
    assert again["origin"] == "reused" and again["job_id"] == report["job_id"]
    assert len((out / "records.jsonl").read_text().splitlines()) == len(records)


def _trials_done(database: Path) -> int:
    try:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5) as db:
            return int(db.execute("SELECT COALESCE(SUM(trials_done), 0) FROM job_tasks")
                       .fetchone()[0])
    except sqlite3.Error:
        return 0  # not created yet


def _tasks(database: Path) -> int:
    try:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5) as db:
            return int(db.execute("SELECT COUNT(*) FROM job_tasks").fetchone()[0])
    except sqlite3.Error:
        return 0  # not created yet


#: trials per task of the interrupted run (two tasks)
TRIALS_PER_TASK = 24


def _interrupt_mid_run(model: Path, out: Path) -> subprocess.CompletedProcess[str] | None:
    """Start ``tuner tune``, send SIGINT as soon as its job's tasks are in the database; None
    if the run finished before the signal landed. (Waiting for recorded trials instead lost the
    race in CI: a worker measures a whole claimed batch, then reports it, so every trial of
    the job could land between two polls.)"""
    process = subprocess.Popen([*TUNER, "tune", str(model), "-o", str(out), "--trials",
                                str(TRIALS_PER_TASK)],
                               cwd=model.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "HOME": str(model.parent)},
                               # a test run started in the background inherits SIGINT ignored
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    while _tasks(out / "tuner.db") == 0 and process.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    if process.returncode == 0 and _trials_done(out / "tuner.db") == 2 * TRIALS_PER_TASK:
        return None
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def test_an_interrupted_run_resumes_from_its_log(small_model: Path) -> None:
    for attempt in range(3):
        out = small_model.parent / f"out{attempt}"
        interrupted = _interrupt_mid_run(small_model, out)
        if interrupted is not None:
            break
    assert interrupted is not None, "every run ended before it could be interrupted"
    assert interrupted.returncode == 130, interrupted.stderr
    assert "rerun the same command to resume" in interrupted.stderr
    before = _trials_done(out / "tuner.db")
    assert 0 <= before < 2 * TRIALS_PER_TASK  # whatever was measured before the signal

    report = _tune(small_model, out, "--trials", str(TRIALS_PER_TASK))
    assert report["origin"] == "resumed" and report["status"] == "done"
    assert sum(t["trials_done"] for t in report["tasks"]) == 2 * TRIALS_PER_TASK
    with sqlite3.connect(out / "tuner.db") as db:
        jobs = db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
    assert jobs == 1  # the same job went on


def test_up_takes_a_model_path(small_model: Path) -> None:
    data = small_model.parent / "up"
    done = run_tuner(["up", "--model", str(small_model), "--trials-per-task", "2",
                      "--data-dir", str(data), "--port", "0"], small_model.parent)
    assert done.returncode == 0, done.stderr
    assert "job 1: model.onnx, 2 tasks" in done.stdout
    assert "job 1: done" in done.stdout
    assert "the server stopped with the job" in done.stdout
