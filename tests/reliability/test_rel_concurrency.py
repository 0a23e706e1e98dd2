"""Concurrency against live processes: a burst of 200 dashboard reads on the embedded SQLite
server while a worker keeps claiming, and two workers sharing one host's default spool, one of
them killed with SIGKILL mid-job. Checks outcomes only (statuses, progress, trial counts); the
latencies are printed (``pytest -s``) for the record, never asserted."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from rel_live import ADMIN, wait_until

from tests.reliability.conftest import Launcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

Rows = Callable[..., list[Any]]
READS = 200
ROUNDS = 3  # each reader reads this many times: the burst lasts long enough to watch claims
WORKLOAD = "dense:M=16,N=64,K=64"


class Claimer(threading.Thread):
    """A worker over plain HTTP: claims, reports a synthetic cost, and counts what it did."""

    def __init__(self, url: str, device_key: str) -> None:
        super().__init__(name="claimer", daemon=True)
        self.http = httpx.Client(base_url=f"{url}/api/v1", timeout=60,
                                 headers={"Authorization": f"Bearer {ADMIN}"})
        answer = self.http.post("/workers/register", json={"device_key": device_key,
                                                           "target": "llvm"})
        assert answer.status_code == 201, answer.text
        self.base = f"/workers/{answer.json()['worker_id']}"
        self.stop = threading.Event()
        self.accepted: list[float] = []  # monotonic time of each accepted result
        self.failures: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            claim = self.http.post(f"{self.base}/claim", json={"max_items": 2, "wait_s": 0.2})
            if claim.status_code != 200:
                self.failures.append(f"claim {claim.status_code}: {claim.text[:200]}")
                continue
            items = claim.json()["items"]
            if not items:
                continue
            results = [{"measure_id": i["measure_id"], "costs": [1e-3], "error_kind": 0}
                       for i in items]
            report = self.http.post(f"{self.base}/results", json={"results": results})
            if report.status_code != 200:
                self.failures.append(f"report {report.status_code}: {report.text[:200]}")
                continue
            now = time.monotonic()
            self.accepted += [now] * len(report.json()["accepted"])
        self.http.close()


def burst(url: str, paths: list[str], rounds: int) -> tuple[list[tuple[int, float]], float,
                                                             float]:
    """``READS`` readers start at once, each reading ``rounds`` times over one shared client
    (a connection each); returns ((status, seconds) per read, start, end)."""
    # idle connections expire here before the server's 5 s keep-alive does: a loaded machine
    # otherwise hands a reader a pooled connection the server is closing (a reset, not an error
    # of the server's)
    browser = httpx.Client(base_url=url, timeout=120, limits=httpx.Limits(
        max_connections=READS, keepalive_expiry=1.0))
    ready = threading.Barrier(READS)

    def read(n: int) -> list[tuple[int, float]]:
        ready.wait()
        out = []
        for step in range(rounds):
            start = time.monotonic()
            answer = browser.get(paths[(n + step) % len(paths)])
            out.append((answer.status_code, time.monotonic() - start))
        return out

    begin = time.monotonic()
    with browser, ThreadPoolExecutor(READS) as pool:
        answers = [a for reader in pool.map(read, range(READS)) for a in reader]
    return answers, begin, time.monotonic()


@pytest.mark.alone  # 200 connections at once: another worker's load reset some of them
def test_200_concurrent_dashboard_reads_on_sqlite_while_claims_flow(
        launch: Launcher, sqlite_url: str) -> None:
    server = launch.server(sqlite_url, queue_depth=16, batch_size=8, lease_s=60.0)
    job_id = server.submit([WORKLOAD, "dense:M=8,N=32,K=64"], trials=400)
    claimer = Claimer(server.url, "rel-cpu")
    claimer.start()
    paths = [f"/api/v1/dashboard/jobs/{job_id}", "/api/v1/dashboard/jobs",
             "/api/v1/dashboard/workers", "/api/v1/jobs", f"/api/v1/jobs/{job_id}"]
    try:
        wait_until(lambda: len(claimer.accepted) >= 20, what="the first results")
        at_once, _, _ = burst(server.url, paths, 1)  # the 200 at once, for the latencies
        # then the same readers keep reading, long enough to see claims served meanwhile
        sustained, begin, end = burst(server.url, paths, ROUNDS)
        during = [t for t in claimer.accepted if begin <= t <= end]
    finally:
        claimer.stop.set()
        claimer.join(60)
    statuses = sorted({status for status, _ in at_once + sustained})
    assert statuses == [200], [s for s, _ in at_once + sustained if s != 200][:10]
    assert not claimer.failures, claimer.failures[:5]
    assert during, "no result was accepted while the reads were in flight"
    first = sorted(seconds for _, seconds in at_once)
    print(f"\n{READS} reads at once: median {statistics.median(first):.3f} s, "
          f"p99 {first[int(0.99 * (len(first) - 1))]:.3f} s, max {first[-1]:.3f} s; then "
          f"{len(sustained)} reads over {end - begin:.2f} s with {len(during)} results "
          "accepted meanwhile")


def test_two_workers_share_the_default_spool_and_one_is_killed_mid_job(
        launch: Launcher, sqlite_url: str, db_rows: Rows, tmp_path: Any) -> None:
    lease_s = 4.0
    server = launch.server(sqlite_url, lease_s=lease_s, heartbeat_s=1.0, max_attempts=5,
                           queue_depth=8, queue_per_worker=2, batch_size=8)
    job_id = server.submit([WORKLOAD], trials=24)
    spool = str(tmp_path / "host-spool")  # one directory for both, as with the default
    first = launch.worker(server, "first", spool_dir=spool, max_items=2,
                          backend_options={"run_s": 0.3})
    second = launch.worker(server, "second", spool_dir=spool, max_items=2,
                           backend_options={"run_s": 0.3})

    def measured_by(name: str) -> int:
        return int(db_rows(sqlite_url, """
            SELECT COUNT(*) FROM measurements m JOIN workers w ON w.id = m.worker_id
            WHERE w.name = :n AND m.state = 'done'""", n=name)[0][0])

    def held_by(name: str) -> int:
        return int(db_rows(sqlite_url, """
            SELECT COUNT(*) FROM measurements m JOIN workers w ON w.id = m.lease_owner
            WHERE w.name = :n AND m.state = 'leased'""", n=name)[0][0])

    wait_until(lambda: measured_by("first") >= 2 and measured_by("second") >= 2
               and held_by("first") >= 1, timeout_s=120, what="both workers measuring")
    assert first.alive and second.alive
    first.kill()
    killed_at = time.monotonic()
    orphaned = [r[0] for r in db_rows(sqlite_url, """
        SELECT m.id FROM measurements m JOIN workers w ON w.id = m.lease_owner
        WHERE w.name = 'first' AND m.state = 'leased'""")]
    final = server.wait_job(job_id, timeout_s=180)
    finished_after = time.monotonic() - killed_at
    assert final["status"] == "done" and second.alive
    rows = db_rows(sqlite_url, """
        SELECT m.id, m.state, m.attempts, w.name FROM measurements m
        JOIN job_tasks t ON t.id = m.job_task_id LEFT JOIN workers w ON w.id = m.worker_id
        WHERE t.job_id = :j AND m.purpose = 'tune'""", j=job_id)
    done = {r.id: r.name for r in rows if r.state == "done"}
    assert len(done) == 24 == sum(t["trials_done"] for t in final["tasks"])
    assert not [r for r in rows if r.state in ("queued", "leased")]
    assert orphaned and all(done[i] == "second" for i in orphaned)
    # measured again after one lapsed lease: the second claim of each orphan is the last
    attempts = {r.id: r.attempts for r in rows}
    assert all(attempts[i] == 2 for i in orphaned), {i: attempts[i] for i in orphaned}
    print(f"\njob finished {finished_after:.1f} s after the kill (lease {lease_s} s), "
          f"{len(orphaned)} orphaned lease(s) measured again by the survivor")
