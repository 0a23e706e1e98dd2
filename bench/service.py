"""Benchmark of the tuning server under many workers (not a test).

Starts ``tuner serve`` (PostgreSQL when the local one answers, else SQLite), submits a job far
larger than the run, and lets N fake workers (threads, one HTTP connection each) claim and
report synthetic results for a fixed time. Prints claims per second and p50/p99 latency of
claim and report calls, and checks the run's integrity: no item held by two workers at once,
every claimed item acknowledged.

    python bench/service.py --json [--workers 64] [--duration-s 15] [--database pg|sqlite|URL]

``run_load`` is also used by the reliability tests against their own server.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ADMIN = "bench-admin-token-0123456789abcdef0123"
DEVICE = "bench-load"
PG_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=3"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
#: distinct workloads of the load job, each with a space far larger than the run needs
WORKLOADS = [f"dense:M={m},N=64,K={k}" for m in (32, 64, 128, 256) for k in (64, 128, 256, 512)]


@dataclasses.dataclass
class LoadStats:
    """What the fake workers saw; shared by the worker threads under ``lock``."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    holder: dict[int, int] = dataclasses.field(default_factory=dict)  # measure id -> worker
    claimed: dict[int, int] = dataclasses.field(default_factory=dict)
    acknowledged: set[int] = dataclasses.field(default_factory=set)
    accepted: dict[int, int] = dataclasses.field(default_factory=dict)  # id -> worker id
    duplicates: int = 0
    rejected: int = 0
    overlaps: int = 0
    claims: int = 0
    empty_claims: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)
    claim_s: list[float] = dataclasses.field(default_factory=list)
    report_s: list[float] = dataclasses.field(default_factory=list)

    def on_claim(self, worker: int, ids: list[int], seconds: float) -> None:
        with self.lock:
            self.claims += 1
            self.empty_claims += not ids
            self.claim_s.append(seconds)
            for i in ids:
                if i in self.holder:  # two workers hold one item at the same time
                    self.overlaps += 1
                self.holder[i] = worker
                self.claimed[i] = self.claimed.get(i, 0) + 1

    def on_report(self, worker: int, answer: dict[str, Any], seconds: float) -> None:
        with self.lock:
            self.report_s.append(seconds)
            done = [*answer["accepted"], *answer["duplicates"],
                    *(r["measure_id"] for r in answer["rejected"])]
            for i in done:
                self.holder.pop(i, None)
                self.acknowledged.add(i)
            self.accepted.update({i: worker for i in answer["accepted"]})
            self.duplicates += len(answer["duplicates"])
            self.rejected += len(answer["rejected"])


def _worker_loop(url: str, token: str, stats: LoadStats, stop: threading.Event,
                 max_items: int, measure_s: float, device_key: str) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=f"{url}/api/v1", headers=headers, timeout=60) as http:
        answer = http.post("/workers/register", json={
            "device_key": device_key, "target": "llvm", "name": "bench-load"})
        answer.raise_for_status()
        worker = int(answer.json()["worker_id"])
        while not stop.is_set():
            try:
                _one_round(http, worker, stats, max_items, measure_s)
            except (httpx.HTTPError, KeyError, ValueError) as e:
                with stats.lock:
                    stats.errors.append(f"{type(e).__name__}: {e}"[:200])
                stop.wait(0.1)


def _one_round(http: httpx.Client, worker: int, stats: LoadStats, max_items: int,
               measure_s: float) -> None:
    start = time.perf_counter()
    answer = http.post(f"/workers/{worker}/claim", json={"max_items": max_items, "wait_s": 0})
    answer.raise_for_status()
    items = answer.json()["items"]
    stats.on_claim(worker, [i["measure_id"] for i in items], time.perf_counter() - start)
    if not items:
        time.sleep(0.05)
        return
    time.sleep(measure_s)  # "measuring"
    results = [{"measure_id": i["measure_id"], "costs": [1e-4 * (1 + i["config"]["index"] % 7)],
                "error_kind": 0, "error_message": "", "compile_time_s": 0.0,
                "wall_time_s": measure_s} for i in items]
    start = time.perf_counter()
    answer = http.post(f"/workers/{worker}/results", json={"results": results})
    answer.raise_for_status()
    stats.on_report(worker, answer.json(), time.perf_counter() - start)


def run_load(url: str, token: str, workers: int = 64, duration_s: float = 15.0,
             max_items: int = 2, measure_s: float = 0.01, device_key: str = DEVICE
             ) -> LoadStats:
    """``workers`` threads claim and report for ``duration_s``; each finishes its last round."""
    stats, stop = LoadStats(), threading.Event()
    threads = [threading.Thread(target=_worker_loop, daemon=True,
                                args=(url, token, stats, stop, max_items, measure_s, device_key))
               for _ in range(workers)]
    for t in threads:
        t.start()
    time.sleep(duration_s)
    stop.set()
    for t in threads:
        t.join(120)
    return stats


def summary(stats: LoadStats, workers: int, duration_s: float) -> dict[str, Any]:
    def ms(values: list[float], q: float) -> float | None:
        if len(values) < 2:
            return None
        return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1e3, 2)

    items = sum(stats.claimed.values())
    return {
        "workers": workers, "duration_s": duration_s,
        "claims": stats.claims, "empty_claims": stats.empty_claims, "items_claimed": items,
        "claims_per_s": round(stats.claims / duration_s, 1),
        "items_per_s": round(items / duration_s, 1),
        "claim_ms_p50": ms(stats.claim_s, 50), "claim_ms_p99": ms(stats.claim_s, 99),
        "report_ms_p50": ms(stats.report_s, 50), "report_ms_p99": ms(stats.report_s, 99),
        "accepted": len(stats.accepted), "duplicates": stats.duplicates,
        "rejected": stats.rejected, "overlaps": stats.overlaps,
        "claimed_more_than_once": sum(1 for n in stats.claimed.values() if n > 1),
        "unacknowledged": len(set(stats.claimed) - stats.acknowledged),
        "errors": len(stats.errors),
    }


# ---- a server for the command line -------------------------------------------------------------

def _postgres_ok() -> bool:
    try:
        import psycopg

        with psycopg.connect(PG_DSN) as conn:
            conn.execute("SELECT 1")
    except Exception:  # unreachable or not installed: fall back to SQLite
        return False
    return True


@contextmanager
def _database(choice: str, tmp: Path) -> Iterator[str]:
    from tuner_service.db.migrate import upgrade

    if choice not in ("pg", "sqlite"):
        yield choice
        return
    if choice == "sqlite" or not _postgres_ok():
        url = f"sqlite:///{tmp / 'bench.db'}"
        upgrade(url)
        yield url
        return
    import psycopg

    schema = f"bench_service_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        url = f"{PG_URL}?options=-csearch_path%3D{schema}"
        upgrade(url)
        yield url
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@contextmanager
def _server(database_url: str, tmp: Path) -> Iterator[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    env.update(TUNER_BOOTSTRAP_TOKEN=ADMIN, TUNER_DATA_DIR=str(tmp), TUNER_LEASE_S="60",
               TUNER_DRIVER_INTERVAL_S="0.1", TUNER_BATCH_SIZE="16", OPENBLAS_NUM_THREADS="1",
               # two items per claim: keep as many again queued, so a claim rarely comes back empty
               TUNER_QUEUE_PER_WORKER="4")
    log = (tmp / "server.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "tuner_service.cli.main", "serve",
                             "--database", database_url, "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited; see {tmp / 'server.log'}")
            try:
                if httpx.get(f"{url}/api/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start in 60 s")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def submit_load_job(url: str, token: str, device_key: str = DEVICE) -> int:
    answer = httpx.post(f"{url}/api/v1/jobs", headers={"Authorization": f"Bearer {token}"},
                        timeout=60, json={"workloads": WORKLOADS, "target": "llvm",
                                          "device_key": device_key, "trials_per_task": 50_000})
    answer.raise_for_status()
    return int(answer.json()["job_id"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--duration-s", type=float, default=15.0)
    parser.add_argument("--max-items", type=int, default=2, help="items per claim")
    parser.add_argument("--measure-ms", type=float, default=10.0,
                        help="simulated measurement time per claim")
    parser.add_argument("--database", default="pg",
                        help="pg (the local PostgreSQL, else SQLite), sqlite, or a URL")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-service-") as raw:
        tmp = Path(raw)
        with _database(args.database, tmp) as db_url, _server(db_url, tmp) as url:
            submit_load_job(url, ADMIN)
            time.sleep(1.0)  # the driver fills the queue
            stats = run_load(url, ADMIN, args.workers, args.duration_s, args.max_items,
                             args.measure_ms / 1e3)
            report = {"database": db_url.split(":", 1)[0].split("+")[0],
                      "cpus": os.cpu_count(), **summary(stats, args.workers, args.duration_s)}
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:24s} {value}")
    return 0 if not (report["overlaps"] or report["unacknowledged"]) else 1


if __name__ == "__main__":
    sys.exit(main())
