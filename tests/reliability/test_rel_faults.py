"""Faults against live processes on loopback: a worker or the server killed with SIGKILL,
PostgreSQL restarted under a running server, double reports, and kernels that crash, hang or
answer wrongly. Each test checks the database afterwards: nothing lost, nothing counted twice.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from rel_live import ADMIN, LiveServer, wait_until

from tests.reliability.conftest import Launcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

Rows = Callable[..., list[Any]]
WORKLOAD = "dense:M=16,N=64,K=64"


def job_rows(db_rows: Rows, url: str, job_id: int) -> list[Any]:
    """(id, state, worker_id, attempts, error_kind, costs) of every trial of a job (the
    re-measurements that confirm its best candidates, ``purpose = 'confirm'``, are not trials)."""
    return db_rows(url, """
        SELECT m.id, m.state, m.worker_id, m.attempts, m.error_kind, m.mean_cost
        FROM measurements m JOIN job_tasks t ON t.id = m.job_task_id
        WHERE t.job_id = :job AND m.purpose = 'tune' ORDER BY m.id""", job=job_id)


def trials_done(db_rows: Rows, url: str, job_id: int) -> int:
    rows = db_rows(url, "SELECT SUM(trials_done) FROM job_tasks WHERE job_id = :job", job=job_id)
    return int(rows[0][0] or 0)


def worker_id(db_rows: Rows, url: str, name: str) -> int:
    rows = db_rows(url, "SELECT id FROM workers WHERE name = :name ORDER BY id", name=name)
    assert rows, f"worker {name} never registered"
    return int(rows[-1][0])


def assert_complete(db_rows: Rows, url: str, job_id: int, budget: int) -> list[Any]:
    """Every trial measured once: as many done rows as counted trials, none pending."""
    rows = job_rows(db_rows, url, job_id)
    done = [r for r in rows if r.state == "done"]
    assert len(done) == budget == trials_done(db_rows, url, job_id)
    assert not [r for r in rows if r.state in ("queued", "leased")]
    return done


def test_worker_killed_mid_batch_its_leases_are_measured_elsewhere(
        launch: Launcher, pg_url: str, db_rows: Rows) -> None:
    server = launch.server(pg_url, lease_s=2.0, heartbeat_s=0.5, max_attempts=5,
                           queue_depth=8, queue_per_worker=0, batch_size=8)
    job_id = server.submit([WORKLOAD], trials=16)
    doomed = launch.worker(server, "doomed", max_items=8, backend_options={"run_s": 0.4})
    doomed_id = 0

    def mid_batch() -> bool:
        nonlocal doomed_id
        if not doomed_id:
            ids = db_rows(pg_url, "SELECT id FROM workers WHERE name = 'doomed'")
            doomed_id = int(ids[0][0]) if ids else 0
        held = db_rows(pg_url, "SELECT COUNT(*) FROM measurements WHERE state = 'leased' "
                               "AND lease_owner = :w", w=doomed_id)[0][0] if doomed_id else 0
        return trials_done(db_rows, pg_url, job_id) >= 2 and held >= 3

    wait_until(mid_batch, what="the first worker mid-batch")
    doomed.kill()
    orphaned = [r[0] for r in db_rows(
        pg_url, "SELECT id FROM measurements WHERE state = 'leased' AND lease_owner = :w",
        w=doomed_id)]
    assert len(orphaned) >= 3
    launch.worker(server, "rescuer", max_items=4, backend_options={"run_s": 0.05})
    assert server.wait_job(job_id)["status"] == "done"

    done = {r.id: r for r in assert_complete(db_rows, pg_url, job_id, 16)}
    rescuer = worker_id(db_rows, pg_url, "rescuer")
    for measure_id in orphaned:  # measured again, by the other worker, on the second claim
        row = done[measure_id]
        assert (row.worker_id, row.attempts, row.error_kind) == (rescuer, 2, 0)
    assert all(r.error_kind == 0 and r.mean_cost > 0 for r in done.values())


def test_server_killed_mid_job_resumes_from_the_database(
        launch: Launcher, pg_url: str, db_rows: Rows) -> None:
    server = launch.server(pg_url, lease_s=5.0, heartbeat_s=1.0, driver_lease_s=2.0,
                           queue_depth=4, batch_size=4)
    job_id = server.submit([WORKLOAD, "dense:M=8,N=32,K=64"], trials=12)
    worker = launch.worker(server, "steady", max_items=2, backend_options={"run_s": 0.15})
    wait_until(lambda: trials_done(db_rows, pg_url, job_id) >= 6, what="some progress")
    server.kill()
    before = {r.id: r for r in job_rows(db_rows, pg_url, job_id) if r.state == "done"}
    owner = db_rows(pg_url, "SELECT driver_owner FROM jobs WHERE id = :j", j=job_id)[0][0]
    assert 6 <= len(before) < 24 and owner  # the dead server still holds the job's lease
    time.sleep(1.0)  # the worker meets a refused connection and backs off
    server.start()  # same port and database, fresh process

    final = server.wait_job(job_id)
    assert final["status"] == "done" and worker.alive
    done = {r.id: r for r in assert_complete(db_rows, pg_url, job_id, 24)}
    assert all(done[i] == row for i, row in before.items())  # kept, not measured again
    owner_after = db_rows(pg_url, "SELECT driver_owner FROM jobs WHERE id = :j", j=job_id)[0][0]
    assert owner_after is None  # released when done by the new server
    # the worker rode out the outage on its first registration
    assert db_rows(pg_url, "SELECT COUNT(*) FROM workers")[0][0] == 1


PG_CLUSTER = ["pg_ctlcluster", "--skip-systemctl-redirect"]


def _cluster() -> list[str]:
    versions = sorted(p.name for p in Path("/etc/postgresql").iterdir()) if Path(
        "/etc/postgresql").is_dir() else []
    return [versions[-1], "main"] if versions else []


def _postgres_online() -> bool:
    from rel_live import postgres_reason

    return not postgres_reason()


def test_postgres_restart_under_a_running_server_recovers_by_itself(
        launch: Launcher, pg_url: str, db_rows: Rows, postgres_lock: Any) -> None:
    cluster = _cluster()
    if not cluster:
        pytest.skip("no local PostgreSQL cluster to restart (pg_ctlcluster)")
    server = launch.server(pg_url, lease_s=10.0, heartbeat_s=1.0, queue_depth=4, batch_size=4)
    job_id = server.submit([WORKLOAD], trials=24)
    launch.worker(server, "patient", max_items=2, backend_options={"run_s": 0.1})
    wait_until(lambda: trials_done(db_rows, pg_url, job_id) >= 4, what="some progress")
    pid = server.proc.pid if server.proc else None
    with postgres_lock.alone():  # tests of other pytest workers wait, not fail
        try:
            restart = subprocess.run([*PG_CLUSTER, *cluster, "restart"], capture_output=True,
                                     text=True, timeout=60)
            assert restart.returncode == 0, restart.stderr
        finally:
            if not _postgres_online():  # never leave the shared database down
                subprocess.run([*PG_CLUSTER, *cluster, "start"], timeout=60, check=False)
        wait_until(_postgres_online, timeout_s=30, what="PostgreSQL back")

    final = server.wait_job(job_id)
    assert final["status"] == "done"
    assert server.alive and server.proc is not None and server.proc.pid == pid
    assert server.call("GET", "/health")["database"] == "ok"
    assert_complete(db_rows, pg_url, job_id, 24)


def _register(server: LiveServer, token: str) -> tuple[httpx.Client, str]:
    http = httpx.Client(base_url=f"{server.url}/api/v1", timeout=30,
                        headers={"Authorization": f"Bearer {token}"})
    answer = http.post("/workers/register", json={"device_key": "rel-cpu", "target": "llvm",
                                                  "name": "twice"})
    assert answer.status_code == 201, answer.text
    return http, f"/workers/{answer.json()['worker_id']}"


def _results(items: list[dict[str, Any]], cost: float) -> dict[str, Any]:
    return {"results": [{"measure_id": i["measure_id"], "costs": [cost], "error_kind": 0,
                         "error_message": "", "compile_time_s": 0.0, "wall_time_s": 0.0}
                        for i in items]}


def test_results_reported_twice_are_stored_once(launch: Launcher, any_url: str,
                                                db_rows: Rows) -> None:
    server = launch.server(any_url, queue_depth=8, batch_size=8)
    job_id = server.submit([WORKLOAD], trials=8)
    http, base = _register(server, ADMIN)
    try:
        wait_until(lambda: db_rows(any_url, "SELECT COUNT(*) FROM measurements "
                                            "WHERE state = 'queued'")[0][0] >= 8,
                   what="queued candidates")
        items = http.post(f"{base}/claim", json={"max_items": 8}).json()["items"]
        assert len(items) == 8
        first, rest = items[:3], items[3:]
        once = http.post(f"{base}/results", json=_results(first, 1e-3)).json()
        again = http.post(f"{base}/results", json=_results(first, 5e-4)).json()
        assert sorted(once["accepted"]) == sorted(i["measure_id"] for i in first)
        assert sorted(again["duplicates"]) == sorted(once["accepted"]) and not again["accepted"]

        answers: list[dict[str, Any]] = []

        def report() -> None:  # the same results from eight connections at once
            with httpx.Client(base_url=http.base_url, headers=http.headers, timeout=30) as c:
                answers.append(c.post(f"{base}/results", json=_results(rest, 2e-3)).json())

        threads = [threading.Thread(target=report) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        http.close()
    accepted = [m for a in answers for m in a["accepted"]]
    assert sorted(accepted) == sorted(i["measure_id"] for i in rest)  # each id once overall
    assert sum(len(a["duplicates"]) for a in answers) == 7 * len(rest)
    done = assert_complete(db_rows, any_url, job_id, 8)
    costs = {r.id: r.mean_cost for r in done}
    assert all(costs[i["measure_id"]] == pytest.approx(1e-3) for i in first)  # first one wins


# config index -> fake fault, and the error kind the server must store for it
FAULTS = {0: "invalid", 1: "compile_error", 2: "runtime_error", 3: "wrong", 4: "exit",
          5: "segfault", 6: "hang_build", 7: "hang_run"}
KINDS = {0: 1, 1: 2, 2: 4, 3: 5, 4: 4, 5: 4, 6: 6, 7: 7}


def test_crashing_hanging_and_wrong_kernels_are_classified_and_the_worker_lives(
        launch: Launcher, sqlite_url: str, db_rows: Rows) -> None:
    """dense 1x1 by 1x2 has 12 configs: the job measures all of them, 8 of them faulty."""
    server = launch.server(sqlite_url, queue_depth=4, batch_size=4)
    # a timeout counts from the dispatch, a fresh measuring child's start included: 3 s leaves
    # room for that start beside another pytest worker (1.5 s timed every build out under load)
    job_id = server.submit(["dense:M=1,N=2,K=1"], trials=12,
                           options={"build_timeout_s": 3.0, "run_timeout_s": 3.0})
    worker = launch.worker(server, "brave", max_items=2,
                           backend_options={"faults": {str(k): v for k, v in FAULTS.items()}})
    assert server.wait_job(job_id, timeout_s=180)["status"] == "done"
    assert worker.alive
    rows = db_rows(sqlite_url, """
        SELECT m.config_index, m.error_kind, m.worker_id FROM measurements m
        JOIN job_tasks t ON t.id = m.job_task_id
        WHERE t.job_id = :j AND m.state = 'done' AND m.purpose = 'tune'""",
                   j=job_id)
    kinds = {r.config_index: r.error_kind for r in rows}
    assert len(kinds) == len(rows) == 12
    assert kinds == {i: KINDS.get(i, 0) for i in range(12)}
    assert len({r.worker_id for r in rows}) == 1  # one worker process measured them all
