"""Benchmark of the tuning server under many workers (not a test).

Starts ``--replicas`` ``tuner serve`` processes on one database (PostgreSQL when the local one
answers, else SQLite), submits a job far larger than the run, and lets N fake workers (threads,
one HTTP connection each, spread over the replicas) claim and report synthetic results in
batches for a fixed time. Prints items per second, p50/p99 latency of claim and report calls,
the servers' CPU time per item (the figure that stays comparable on a busy machine), and the
run's integrity: claims that came back empty while the job had work queued (the database is
sampled every 50 ms), items held by two workers at once or claimed twice, claimed items never
acknowledged, and, read back from the database, accepted results not stored (lost) or counted
twice (duplicated).

The job's tuner is ``random`` by default: this measures the queue, not the search (a model-based
tuner's proposals cost an annealing run per refit; ``--tuner xgb-transfer`` shows that bound).

    python bench/service.py --json [--workers 64] [--replicas 1] [--duration-s 15]
                            [--max-items 16] [--database pg|sqlite|URL] [--tuner random]

``run_load`` is also used by the reliability tests against their own server.
"""

from __future__ import annotations

import argparse
import bisect
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
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from schedule_templates.protocol import ClaimItem, Report
from schedule_templates.records import MeasureResult

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
    #: (start, end) monotonic seconds of each claim that came back empty
    empty_at: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    #: (monotonic seconds, queued measurements) sampled from the database during the run
    queued: list[tuple[float, int]] = dataclasses.field(default_factory=list)

    def on_claim(self, worker: int, ids: list[int], start: float, end: float) -> None:
        with self.lock:
            self.claims += 1
            self.empty_claims += not ids
            self.claim_s.append(end - start)
            if not ids:
                self.empty_at.append((start, end))
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


    def empty_while_queued(self) -> int:
        """Empty claims during which work was queued throughout: every sample from the last
        one before the claim was sent to the first one after its answer saw queued items."""
        times = [t for t, _n in self.queued]
        count = 0
        for start, end in self.empty_at:
            before, after = bisect.bisect_right(times, start) - 1, bisect.bisect_left(times, end)
            if before >= 0 and after < len(times) and \
                    all(n > 0 for _t, n in self.queued[before:after + 1]):
                count += 1
        return count


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
    start = time.monotonic()
    answer = http.post(f"/workers/{worker}/claim", json={"max_items": max_items, "wait_s": 0})
    answer.raise_for_status()
    items = [ClaimItem.from_json(item) for item in answer.json()["items"]]
    stats.on_claim(worker, [int(i.measure_id) for i in items], start, time.monotonic())
    if not items:
        time.sleep(0.05)
        return
    time.sleep(measure_s)  # "measuring"
    results = [Report(i.measure_id, MeasureResult((1e-4 * (1 + (i.candidate.index or 0) % 7),),
                                                  wall_time_s=measure_s),
                      timings={"measure_s": measure_s}).to_json() for i in items]
    start = time.perf_counter()
    answer = http.post(f"/workers/{worker}/results", json={"results": results})
    answer.raise_for_status()
    stats.on_report(worker, answer.json(), time.perf_counter() - start)


def run_load(url: str | Sequence[str], token: str, workers: int = 64, duration_s: float = 15.0,
             max_items: int = 16, measure_s: float = 0.01, device_key: str = DEVICE,
             queued: Callable[[], int] | None = None) -> LoadStats:
    """``workers`` threads claim and report for ``duration_s``; each finishes its last round.
    Several ``url``s (replicas of one service) get the workers in turn. ``queued``: reads how
    many measurements wait in the queue, sampled every 50 ms while the load runs."""
    urls = [url] if isinstance(url, str) else list(url)
    stats, stop = LoadStats(), threading.Event()
    threads = [threading.Thread(target=_worker_loop, daemon=True,
                                args=(urls[n % len(urls)], token, stats, stop, max_items,
                                      measure_s, device_key))
               for n in range(workers)]
    if queued is not None:
        threads.append(threading.Thread(target=_sample_queue, daemon=True,
                                        args=(queued, stats, stop)))
    for t in threads:
        t.start()
    time.sleep(duration_s)
    stop.set()
    for t in threads:
        t.join(120)
    return stats


def _sample_queue(queued: Callable[[], int], stats: LoadStats, stop: threading.Event) -> None:
    while True:
        count = queued()
        with stats.lock:
            stats.queued.append((time.monotonic(), count))
        if stop.wait(0.05):
            count = queued()  # one sample after the last claims
            with stats.lock:
                stats.queued.append((time.monotonic(), count))
            return


def summary(stats: LoadStats, workers: int, duration_s: float) -> dict[str, Any]:
    def ms(values: list[float], q: float) -> float | None:
        if len(values) < 2:
            return None
        return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1e3, 2)

    items = sum(stats.claimed.values())
    depth = sorted(n for _t, n in stats.queued)
    return {
        "workers": workers, "duration_s": duration_s,
        "claims": stats.claims, "empty_claims": stats.empty_claims,
        "empty_claims_while_queued": stats.empty_while_queued() if stats.queued else None,
        # the queue's depth as sampled: how far the job driver keeps ahead of the claims
        "queued_p10": depth[len(depth) // 10] if depth else None,
        "queued_p50": depth[len(depth) // 2] if depth else None,
        "queued_at_zero": round(sum(1 for n in depth if n == 0) / len(depth), 3) if depth else None,
        "items_claimed": items,
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


class Probe:
    """A direct look at the benchmark's database: the queue while the load runs, then what
    was stored. Its own connection, not the servers' (psycopg or sqlite3)."""

    def __init__(self, database_url: str) -> None:
        if database_url.startswith("sqlite"):
            import sqlite3

            self._conn: Any = sqlite3.connect(database_url.split("///", 1)[1],
                                              check_same_thread=False)
            self._mark = "?"
        else:
            import psycopg

            schema = database_url.split("search_path%3D", 1)[1] \
                if "search_path%3D" in database_url else "public"
            self._conn = psycopg.connect(PG_DSN, autocommit=True,
                                         options=f"-csearch_path={schema}")
            self._mark = "%s"
        self._lock = threading.Lock()

    def one(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        with self._lock:
            row = self._conn.execute(sql, params).fetchone()
        return row[0] if row else None

    def queued(self) -> int:
        return int(self.one("SELECT COUNT(*) FROM measurements WHERE state = 'queued'") or 0)

    def stored(self, job_id: int) -> dict[str, int]:
        mark = self._mark
        done = self.one("SELECT COUNT(*) FROM measurements m JOIN job_tasks t ON "
                        f"t.id = m.job_task_id WHERE t.job_id = {mark} AND m.state = 'done'",
                        (job_id,))
        counted = self.one(f"SELECT SUM(trials_done) FROM job_tasks WHERE job_id = {mark}",
                           (job_id,))
        return {"done": int(done or 0), "counted": int(counted or 0)}

    def close(self) -> None:
        self._conn.close()


def _cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process so far (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _postgres_cpu_s() -> float:
    """CPU seconds of every ``postgres`` process on this machine so far (Linux; the local
    PostgreSQL's backends serve the servers' connections): where the rest of the cores go."""
    def named_postgres(comm: Path) -> bool:
        try:
            return comm.read_text().strip() == "postgres"
        except OSError:  # it exited meanwhile
            return False

    return sum(_cpu_s(int(comm.parent.name)) for comm in Path("/proc").glob("[0-9]*/comm")
               if named_postgres(comm))


@contextmanager
def _server(database_url: str, tmp: Path, name: str = "server") -> Iterator[tuple[str, int]]:
    """A ``tuner serve`` process: its URL and process id."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    env.update(TUNER_BOOTSTRAP_TOKEN=ADMIN, TUNER_DATA_DIR=str(tmp), TUNER_LEASE_S="60",
               TUNER_DRIVER_INTERVAL_S="0.1", TUNER_BATCH_SIZE="16", OPENBLAS_NUM_THREADS="1")
    log = (tmp / f"{name}.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "tuner_service.cli.main", "serve",
                             "--database", database_url, "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited; see {tmp / f'{name}.log'}")
            try:
                if httpx.get(f"{url}/api/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start in 60 s")
            time.sleep(0.1)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def submit_load_job(url: str, token: str, device_key: str = DEVICE, tuner: str = "random"
                    ) -> int:
    answer = httpx.post(f"{url}/api/v1/jobs", headers={"Authorization": f"Bearer {token}"},
                        timeout=60, json={"workloads": WORKLOADS, "target": "llvm",
                                          "device_key": device_key, "trials_per_task": 50_000,
                                          "tuner": tuner})
    answer.raise_for_status()
    return int(answer.json()["job_id"])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--replicas", type=int, default=1,
                        help="tuner serve processes sharing the database")
    parser.add_argument("--duration-s", type=float, default=15.0)
    parser.add_argument("--max-items", type=int, default=16, help="items per claim")
    parser.add_argument("--measure-ms", type=float, default=10.0,
                        help="simulated measurement time per claim")
    parser.add_argument("--database", default="pg",
                        help="pg (the local PostgreSQL, else SQLite), sqlite, or a URL")
    parser.add_argument("--tuner", default="random", help="the load job's tuner")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-service-") as raw, ExitStack() as stack:
        tmp = Path(raw)
        db_url = stack.enter_context(_database(args.database, tmp))
        servers = [stack.enter_context(_server(db_url, tmp, f"server{n}"))
                   for n in range(max(1, args.replicas))]
        urls, pids = [u for u, _p in servers], [p for _u, p in servers]
        probe = Probe(db_url)
        stack.callback(probe.close)
        job_id = submit_load_job(urls[0], ADMIN, tuner=args.tuner)
        time.sleep(1.0)  # the driver fills the queue
        cpu_before = sum(_cpu_s(p) for p in pids)
        own_before, pg_before = time.process_time(), _postgres_cpu_s()
        stats = run_load(urls, ADMIN, args.workers, args.duration_s, args.max_items,
                         args.measure_ms / 1e3, queued=probe.queued)
        cpu = sum(_cpu_s(p) for p in pids) - cpu_before
        own, pg = time.process_time() - own_before, _postgres_cpu_s() - pg_before
        stored = probe.stored(job_id)
        report = {"database": db_url.split(":", 1)[0].split("+")[0], "replicas": len(urls),
                  "tuner": args.tuner, "max_items": args.max_items, "cpus": os.cpu_count(),
                  "load_avg_1m": round(os.getloadavg()[0], 2),
                  **summary(stats, args.workers, args.duration_s),
                  "server_cpu_s": round(cpu, 2),
                  "server_cpu_ms_per_item": round(cpu * 1e3 / max(1, len(stats.accepted)), 3),
                  # the rest of the machine's cores: the fake workers (this process) and the
                  # database's backends (0 for SQLite, which runs inside the servers)
                  "workers_cpu_ms_per_item": round(own * 1e3 / max(1, len(stats.accepted)), 3),
                  "database_cpu_ms_per_item": round(pg * 1e3 / max(1, len(stats.accepted)), 3),
                  "lost": max(0, len(stats.accepted) - stored["done"]),
                  "duplicated": max(0, stored["counted"] - stored["done"])}
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:26s} {value}")
    bad = ("overlaps", "claimed_more_than_once", "unacknowledged", "lost", "duplicated")
    return 1 if any(report[k] for k in bad) else 0


if __name__ == "__main__":
    sys.exit(main())
