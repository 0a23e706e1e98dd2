"""Benchmark of the measurement worker (not a test).

0. Pipeline: one worker with its defaults (builds beside the timed runs, claims prefetched,
   batched reports, the compile cache) on random valid configs of ResNet-18's conv tasks from
   the stub server, with the server's default run protocol: candidates per minute, the overhead
   per candidate (wall time per candidate minus its timed protocol) and each stage's p50/p90
   from the results' ``timings``. A share of the items repeat an earlier config (the server
   re-measures its bests), which the compile cache serves.
1. Overhead: per candidate, the time from a claim's answer to the acknowledged report, minus
   the candidate's own measurement (compile + check + timed runs, the child's wall time). Uses
   the real server on loopback (SQLite) when its dependencies are installed, else the stub
   server; the JSON says which. One item per claim: the worst case.
2. Repeatability: one config measured 10 times in separate claims (stub server, llvm backend);
   coefficient of variation of the 10 mean costs.

    python bench/worker.py --json
    python bench/worker.py --json --only pipeline --pipeline-candidates 120
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from schedule_templates.protocol import Candidate, ClaimItem, Target
from schedule_templates.records import MeasureOptions
from workers.agent import Agent
from workers.backends import BackendSpec
from workers.client import ServerClient
from workers.compile_cache import CompileCache
from workers.hardware import cpu_facts
from workers.measure import measure_candidate
from workers.measure.pool import IsolatedMeasurer
from workers.settings import WorkerSettings
from workers.spool import Spool
from workers.stub_server import StubServer
from workers.timings import STAGES

TOKEN = "bench-admin-token-0123456789abcdef"
DEVICE = "bench-cpu"


class TimingClient(ServerClient):
    """Records when each item's claim answered and when its report was acknowledged."""

    def __init__(self, *args: Any, stop: threading.Event, wanted: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.claimed: dict[Any, float] = {}
        self.acked: dict[Any, float] = {}
        self.results: dict[Any, dict[str, Any]] = {}
        self._stop, self._wanted = stop, wanted

    def claim(self, worker_id: str, max_items: int, wait_s: float) -> list[dict[str, Any]]:
        items = super().claim(worker_id, max_items, wait_s)
        now = time.perf_counter()
        self.claimed.update({item["measure_id"]: now for item in items})
        return items

    def report(self, worker_id: str, results: list[dict[str, Any]]) -> dict[str, Any]:
        answer = super().report(worker_id, results)
        now = time.perf_counter()
        for mid in [*answer.get("accepted", []), *answer.get("duplicates", [])]:
            self.acked.setdefault(mid, now)
        self.results.update({r["measure_id"]: r for r in results})
        if len(self.acked) >= self._wanted:
            self._stop.set()
        return answer


def run_agent(url: str, token: str, backend: BackendSpec, wanted: int, spool_dir: Path,
              **overrides: Any) -> TimingClient:
    """A worker until ``wanted`` results are acknowledged; by default the old one-at-a-time
    loop (one item per claim, no overlap), which the overhead and repeatability parts measure."""
    values: dict[str, Any] = {"max_idle_s": 20.0, "poll_s": 1.0, "max_items": 1,
                              "pipeline": False, "overlap_builds": False, **overrides}
    settings = WorkerSettings(server=url, token=token, device_key=DEVICE, backend=backend.name,
                              spool_dir=spool_dir, **values)
    stop = threading.Event()
    client = TimingClient(url, token, stop=stop, wanted=wanted)
    cache = CompileCache(settings.compile_cache_entries,
                         int(settings.compile_cache_mb * 1024 * 1024))
    with Spool(spool_dir) as spool, client, IsolatedMeasurer(
            backend, settings.parallel_build, overlap=settings.overlap_builds,
            cache=cache) as measurer:
        Agent(settings, client, spool, measurer, stop).run()
        client.cache_hits = cache.hits  # type: ignore[attr-defined]
    return client


def resnet18_items(candidates: int, repeat_share: float, seed: int) -> list[dict[str, Any]]:
    """Random valid configs of ResNet-18's conv tasks, round robin; a share repeats one."""
    from workloads import RESNET18_CONVS  # bench/workloads.py, beside this script

    from schedule_templates.errors import InvalidConfigError
    from schedule_templates.templates.base import get_template
    from schedule_templates.workloads import parse_workload

    rng = random.Random(seed)
    options = MeasureOptions(number=1, repeat=3, min_repeat_ms=50.0)
    items: list[dict[str, Any]] = []
    while len(items) < candidates:
        key = RESNET18_CONVS[len(items) % len(RESNET18_CONVS)]
        if items and rng.random() < repeat_share:
            items.append({**rng.choice(items), "measure_id": len(items)})
            continue
        workload = parse_workload(key)
        template = get_template(workload.op, "llvm")
        space = template.space(workload)
        while True:
            config = space.get(rng.randrange(space.size))
            try:
                template.check(workload, config)
                break
            except InvalidConfigError:
                continue
        items.append(ClaimItem(len(items), Candidate.of(template, workload, config),
                               Target("llvm"), options).to_json())
    return items


#: the worker's defaults, and the loop before the pipeline (for ``--compare``)
PIPELINED = {"max_items": 0, "pipeline": True, "overlap_builds": True}
ONE_AT_A_TIME = {"max_items": 1, "pipeline": False, "overlap_builds": False,
                 "compile_cache_entries": 0}


def bench_pipeline(candidates: int, repeat_share: float, tmp: Path, parallel_build: int = 1,
                   settings: dict[str, Any] | None = None) -> dict[str, Any]:
    items = resnet18_items(candidates, repeat_share, seed=0)
    with StubServer(TOKEN, heartbeat_s=10.0) as stub:
        stub.queue += items
        start = time.perf_counter()
        client = run_agent(stub.url, TOKEN, BackendSpec("llvm"), candidates,
                           tmp / f"spool-{time.monotonic_ns()}", parallel_build=parallel_build,
                           **(settings or PIPELINED))
    done = [client.results[i] for i in sorted(client.acked)]
    elapsed = max(client.acked.values()) - start
    timings = [r["timings"] for r in done if "timings" in r]
    measure_s = statistics.fmean(t["measure_s"] for t in timings)
    stages = {}
    for name in STAGES:
        values = sorted(t[name] * 1e3 for t in timings)
        stages[name] = {"p50_ms": round(values[len(values) // 2], 1),
                        "p90_ms": round(values[int(0.9 * (len(values) - 1))], 1)}
    per_candidate_ms = elapsed / len(done) * 1e3
    return {
        "tasks": "ResNet-18 convs (11), random valid configs, threads=1, repeat=3, "
                 "min_repeat_ms=50", "parallel_build": parallel_build,
        "settings": settings or PIPELINED, "candidates": len(done),
        "ok": sum(1 for r in done if r["error_kind"] == 0),
        "repeat_share": repeat_share, "compile_cache_hits": getattr(client, "cache_hits", 0),
        "elapsed_s": round(elapsed, 2),
        "candidates_per_min": round(60.0 * len(done) / elapsed, 1), "target_per_min": 120,
        "per_candidate_ms": round(per_candidate_ms, 1),
        "overhead_per_candidate_ms": round(per_candidate_ms - measure_s * 1e3, 1),
        "overhead_target_ms": 150, "stages": stages,
        "noisy_share": round(sum(1 for r in done if r.get("noisy")) / len(done), 3),
        "load_average_at_end": os.getloadavg(),
    }


def overhead_stats(client: TimingClient, skip_first: int = 1) -> dict[str, Any]:
    ids = sorted(set(client.claimed) & set(client.acked), key=client.claimed.__getitem__)
    per = [(client.acked[i] - client.claimed[i] - client.results[i]["wall_time_s"]) * 1e3
           for i in ids[skip_first:]]
    per.sort()
    return {"candidates": len(per), "median_ms": statistics.median(per),
            "mean_ms": statistics.fmean(per), "p90_ms": per[int(0.9 * (len(per) - 1))],
            "max_ms": per[-1], "target_ms": 50.0, "meets_target": statistics.median(per) < 50}


def bench_overhead(candidates: int, tmp: Path) -> dict[str, Any]:
    backend = BackendSpec("fake", {"validate": True})
    try:
        server: Any = LiveServer(tmp / "server")
    except ImportError:
        server = None
    if server is None:
        with StubServer(TOKEN, heartbeat_s=10.0) as stub:
            stub.queue += [stub_item(i, index=i) for i in range(candidates + 1)]
            client = run_agent(stub.url, TOKEN, backend, candidates + 1, tmp / "spool")
        return {"server": "stub (the real server is not installed)", **overhead_stats(client)}
    with server:
        server.submit(candidates + 1)
        client = run_agent(server.url, TOKEN, backend, candidates + 1, tmp / "spool")
    return {"server": "real (SQLite, uvicorn on loopback)", "backend": "fake",
            **overhead_stats(client)}


def bench_repeatability(workload: str, claims: int, tmp: Path) -> dict[str, Any]:
    from schedule_templates.templates.base import get_template
    from schedule_templates.workloads import parse_workload

    w = parse_workload(workload)
    template = get_template(w.op, "llvm")
    index = template.default_config(w).index
    with StubServer(TOKEN, heartbeat_s=10.0) as stub:
        stub.queue += [stub_item(i, index=index, workload=workload, template=template.name)
                       for i in range(claims)]
        client = run_agent(stub.url, TOKEN, BackendSpec("llvm"), claims, tmp / "spool2")
    results = [client.results[i] for i in range(claims)]
    means = [statistics.fmean(r["costs"]) for r in results if r["costs"]]
    if len(means) < 2:
        return {"error": [r["error_message"] for r in results][:3]}
    cv = statistics.stdev(means) / statistics.fmean(means)
    # The baseline: the same config measured in this process, no worker, no server, right
    # after; it shows how much of the spread is the machine's own.
    baseline = [measure_candidate(workload, template.name, {"index": index}, "llvm",
                                  MeasureOptions(), 1).mean_cost for _ in range(claims)]
    return {"workload": workload, "template": template.name, "config": index,
            "claims": len(means), "mean_ms": statistics.fmean(means) * 1e3,
            "gflops": w.flops() / statistics.fmean(means) / 1e9,
            "cv_percent": cv * 100, "target_percent": 3.0, "meets_target": cv < 0.03,
            "baseline_in_process_cv_percent":
                statistics.stdev(baseline) / statistics.fmean(baseline) * 100,
            "costs_ms": [round(m * 1e3, 4) for m in means]}


def stub_item(measure_id: int, index: int, workload: str = "dense:M=64,N=64,K=64",
              template: str = "dense.x86") -> dict[str, Any]:
    return ClaimItem(measure_id, Candidate(template, workload, {"index": index}),
                     Target("llvm")).to_json()


class LiveServer:
    """The real service (the embedded service's server thread) on a free loopback port;
    raises ImportError without its packages."""

    def __init__(self, data_dir: Path) -> None:
        import uvicorn  # noqa: F401  (missing: the caller falls back to the stub server)
        from pydantic import SecretStr

        from tuner_service.db.migrate import upgrade
        from tuner_service.settings import Settings
        from tuner_service.tuning.embedded import free_port, server_thread

        data_dir.mkdir(parents=True)
        db = f"sqlite:///{data_dir / 'tuner.sqlite'}"
        upgrade(db)
        settings = Settings(data_dir=data_dir, database_url=db, host="127.0.0.1",
                            port=free_port("127.0.0.1", 0), bootstrap_token=SecretStr(TOKEN),
                            driver_interval_s=0.05, batch_size=8, queue_depth=16)
        self.url = f"http://127.0.0.1:{settings.port}"
        self._server = server_thread(settings)

    def __enter__(self) -> LiveServer:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(None, None, None)

    def submit(self, trials: int) -> None:
        import httpx

        body = {"workloads": ["dense:M=64,N=64,K=64"], "target": "llvm", "device_key": DEVICE,
                "trials_per_task": trials, "tuner": "random"}
        httpx.post(f"{self.url}/api/v1/jobs", json=body, timeout=30,
                   headers={"Authorization": f"Bearer {TOKEN}"}).raise_for_status()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--candidates", type=int, default=40)
    parser.add_argument("--claims", type=int, default=10)
    parser.add_argument("--workload", default="dense:M=512,N=512,K=512")
    parser.add_argument("--pipeline-candidates", type=int, default=90)
    parser.add_argument("--repeat-share", type=float, default=0.1,
                        help="share of pipeline items that repeat an earlier config")
    parser.add_argument("--parallel-build", type=int, default=1,
                        help="build processes of the pipelined worker")
    parser.add_argument("--compare", action="store_true",
                        help="also run the pipeline's items through the one-at-a-time loop")
    parser.add_argument("--only", choices=("pipeline", "overhead", "repeatability"),
                        help="run one part")
    args = parser.parse_args(argv)
    parts = {
        "pipeline": lambda tmp: bench_pipeline(args.pipeline_candidates, args.repeat_share, tmp,
                                               args.parallel_build),
        "one_at_a_time": lambda tmp: bench_pipeline(args.pipeline_candidates,
                                                    args.repeat_share, tmp,
                                                    settings=ONE_AT_A_TIME),
        "overhead": lambda tmp: bench_overhead(args.candidates, tmp),
        "repeatability": lambda tmp: bench_repeatability(args.workload, args.claims, tmp),
    }
    with tempfile.TemporaryDirectory() as tmp:
        report: dict[str, Any] = {
            "machine": {k: cpu_facts()[k] for k in ("cpu_model", "logical_cores", "vector_bits")},
            "load_average_at_start": os.getloadavg(),
        }
        for name, part in parts.items():
            wanted = args.compare if name == "one_at_a_time" else args.only in (None, name)
            if wanted:
                report[name] = part(Path(tmp))
    print(json.dumps(report, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
