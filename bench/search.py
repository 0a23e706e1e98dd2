"""Search efficiency of the tuners, replayed on measured data (no kernel is run).

    python bench/search.py [--quick] [--json] [--markdown docs/search.md]

For every workload of the replay dataset (``bench/search_dataset.py``) each tuner searches the
measured configs with ask/tell, answered from the recorded costs, for several seeds: the curve
of the best throughput against trials, and the trials needed to reach 90% and 95% of the best
config in the dataset. ``xgb-transfer`` also receives the records of the other workloads
(leave-one-out). Then the cost model's held-out ranking quality. Prints one JSON object.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from search_dataset import DATA_DIR, Dataset, load_datasets, summary
from search_eval import Table, evaluate, make_table
from search_replay import JobTask, Replay, SearchTrace, replay_space, run_job, run_search
from search_report import write_markdown

from schedule_templates.templates.base import get_template
from schedule_templates.workloads import parse_workload
from tuner_service.cost_model import XGBParams
from tuner_service.jobs.scheduler import make_scheduler
from tuner_service.tuners import TRANSFER_TUNERS, make_tuner, tuner_names

TUNERS = ("random", "ga", "xgb", "xgb-transfer")
CHECKPOINTS = (8, 16, 32, 64, 128, 256, 512)
LEVELS = (0.9, 0.95)
#: the workloads ``--quick`` searches (two of each template, one of them unlike the others)
QUICK = ("dense:M=512,N=512,K=512", "dense:M=1,N=1000,K=512",
         "conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1",
         "conv2d:N=1,C=128,H=28,W=28,K=256,R=1,S=1,stride=2")
#: how often each dataset workload runs in one ResNet-18 inference: the replayed job on which
#: the task schedulers are compared
RESNET18_WEIGHTS = {
    "conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1": 4,
    "conv2d:N=1,C=128,H=28,W=28,K=128,R=3,S=3,pad=1": 3,
    "conv2d:N=1,C=256,H=14,W=14,K=256,R=3,S=3,pad=1": 3,
    "conv2d:N=1,C=128,H=28,W=28,K=256,R=1,S=1,stride=2": 1,
    "dense:M=1,N=1000,K=512": 1,
}


class Workload:
    """One dataset file made ready for replay."""

    def __init__(self, data: Dataset, cost: str) -> None:
        self.data = data
        self.key = data.key
        self.workload = parse_workload(data.key)
        self.template = get_template(self.workload.op)
        self.space = self.template.space(self.workload)
        pick = (lambda r: r.fastest) if cost == "fastest" else (lambda r: r.cost)
        self.costs = {r.index: (pick(r) or r.cost) if r.cost is not None else None
                      for r in data.records}
        errors = {r.index: r.error for r in data.records}
        self.replay = Replay(replay_space(self.space, self.costs), self.costs, errors)
        self.best_gflops = self.workload.flops() / self.replay.best_cost / 1e9

    def table(self) -> Table:
        return make_table(self.key, self.template, self.workload, self.costs)


def transfer_records(workloads: list[Workload], exclude: str) -> list[Any]:
    """The other workloads' records, as the shared log would hand them to a new task."""
    from tuner_service.tuners.transfer import TransferRecord

    out = []
    for w in workloads:
        if w.key == exclude:
            continue
        results = w.replay.results(sorted(w.costs))
        out += [TransferRecord(w.key, w.template.name, index, result)
                for index, result in zip(sorted(w.costs), results, strict=True)]
    return out


#: tuners whose proposals are built knob by knob: they search the whole template space and
#: their proposals are moved to the nearest measured config (see search_replay.py)
PROJECTED = frozenset({"ga"})


def tuner_for(name: str, w: Workload, workloads: list[Workload], seed: int) -> Any:
    space = w.replay.loose if name in PROJECTED else w.replay.space
    transfer = transfer_records(workloads, w.key) if name in TRANSFER_TUNERS else []
    # one xgboost thread: on a shared 2-core machine OpenMP threads that wait for each other
    # made every fit ~10x slower (the proposals are the same)
    options = {"model_params": XGBParams(nthread=1, seed=seed)} if "xgb" in name else {}
    return make_tuner(name, w.workload, space, seed, template=w.template, transfer=transfer,
                      **options)


def search(name: str, w: Workload, workloads: list[Workload], seed: int, trials: int,
           batch: int) -> SearchTrace:
    return run_search(tuner_for(name, w, workloads, seed), w.replay, trials, batch)


def job_check(workloads: list[Workload], tuner: str, seeds: int, per_task: int,
              batch: int) -> dict[str, Any]:
    """End-to-end latency of a replayed ResNet-18 job, gradient against round-robin scheduling,
    as a multiple of the best the dataset allows (1.0), at a quarter, half and all of the
    trials (``per_task`` x tasks)."""
    chosen = [w for w in workloads if w.key in RESNET18_WEIGHTS]
    if not chosen:
        return {}
    total = per_task * len(chosen)
    optimum = sum(RESNET18_WEIGHTS[w.key] * w.replay.best_cost for w in chosen)
    marks = [total // 4, total // 2, total]
    out: dict[str, Any] = {"tuner": tuner, "tasks": len(chosen), "trials": total,
                           "optimum_ms": round(optimum * 1e3, 3)}
    for name in ("gradient", "round-robin"):
        runs = []
        for seed in range(seeds):
            tasks = [JobTask(RESNET18_WEIGHTS[w.key], w.workload.flops(), w.replay,
                             tuner_for(tuner, w, workloads, seed), w.template.name)
                     for w in chosen]
            runs.append(run_job(make_scheduler(name, seed=seed), tasks, total, batch))
        out[name] = {str(m): round(statistics.fmean(r[m - 1] for r in runs) / optimum, 4)
                     for m in marks}
    return out


def summarise(traces: list[SearchTrace], trials: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for level in LEVELS:
        reached = [t.trials_to(level) for t in traces]
        # a search that never got there counts as the whole budget (a lower bound)
        counted = [r if r is not None else trials for r in reached]
        out[f"trials_to_{round(level * 100)}"] = {
            "mean": round(statistics.fmean(counted), 1), "per_seed": reached,
            "not_reached": sum(r is None for r in reached)}
    out["curve"] = {str(c): round(statistics.fmean(t.best_fraction[min(c, len(t.best_fraction))
                                                                    - 1] for t in traces), 4)
                    for c in CHECKPOINTS if c <= trials}
    out["projected"] = sum(t.projected for t in traces)
    out["tuner_s"] = round(sum(t.tuner_s for t in traces) / len(traces), 2)
    return out


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return round(math.exp(statistics.fmean(map(math.log, values))), 2) if values else None


def targets(rows: dict[str, dict[str, Any]], tuners: list[str]) -> dict[str, Any]:
    def level(tuner: str, name: str) -> float | None:
        if tuner not in tuners:
            return None
        return geomean([row[tuner][name]["mean"] for row in rows.values()])

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a and b else None

    xgb_vs_random = ratio(level("xgb", "trials_to_95"), level("random", "trials_to_95"))
    transfer_vs_xgb = ratio(level("xgb-transfer", "trials_to_90"), level("xgb", "trials_to_90"))
    return {
        "geomean_trials_to_90": {t: level(t, "trials_to_90") for t in tuners},
        "geomean_trials_to_95": {t: level(t, "trials_to_95") for t in tuners},
        "xgb_over_random_trials_to_95": xgb_vs_random,
        "xgb_transfer_over_xgb_trials_to_90": transfer_vs_xgb,
        "target_xgb_half_of_random": xgb_vs_random is not None and xgb_vs_random <= 0.5,
        "target_transfer_half_of_xgb": transfer_vs_xgb is not None and transfer_vs_xgb <= 0.5,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="4 workloads and 3 seeds (5 seeds otherwise): about a minute")
    parser.add_argument("--json", action="store_true", help="only the JSON object")
    parser.add_argument("--seeds", type=int, help="seeds per tuner and workload (3 quick, 5)")
    parser.add_argument("--trials", type=int, help="trial budget per search (400)")
    parser.add_argument("--batch", type=int, default=8, help="configs asked at once")
    parser.add_argument("--tuners", default=",".join(TUNERS))
    parser.add_argument("--only", help="substring filter on workload keys")
    parser.add_argument("--cost", choices=("fastest", "mean"), default="fastest",
                        help="which recorded cost is the truth (fastest sample: less noise)")
    parser.add_argument("--data", type=Path, default=DATA_DIR)
    parser.add_argument("--markdown", type=Path, help="also write a summary (docs/search.md)")
    args = parser.parse_args()
    seeds = (args.seeds or 3) if args.quick else (args.seeds or 5)
    # 400 covers every dataset file whole, so no search is cut short; a search stops early
    # once it has found the best config, which keeps this cheap
    trials = args.trials or 400
    start = time.perf_counter()
    workloads = [Workload(d, args.cost) for d in load_datasets(args.data)]
    # every workload lends its records to xgb-transfer; the searches run on a selection
    searched = [w for w in workloads if (not args.only or args.only in w.key)
                and (not args.quick or w.key in QUICK)]
    known = set(tuner_names())
    tuners = [t for t in args.tuners.split(",") if t in known]
    rows: dict[str, dict[str, Any]] = {}
    for w in searched:
        rows[w.key] = {"configs": len(w.costs), "best_gflops": round(w.best_gflops, 1)}
        for name in tuners:
            traces = [search(name, w, workloads, seed, trials, args.batch)
                      for seed in range(seeds)]
            rows[w.key][name] = summarise(traces, trials)
            if not args.json:
                print(f"{w.key:<52} {name:<13} {rows[w.key][name]['trials_to_95']['mean']:>6}",
                      file=sys.stderr, flush=True)
    job_tuner = "xgb" if "xgb" in tuners else "random"
    job = job_check(workloads, job_tuner, seeds, 32 if args.quick else 64, args.batch)
    model = evaluate([w.table() for w in workloads], seeds=range(min(seeds, 3)),
                     scored={w.key for w in searched})
    report = {
        "dataset": str(args.data), "cost": args.cost, "seeds": seeds, "trials": trials,
        "batch": args.batch, "tuners": tuners,
        "missing_tuners": [t for t in args.tuners.split(",") if t not in known],
        "workloads": rows, "summary": targets(rows, tuners), "cost_model": model, "job": job,
        "host": workloads[0].data.header["host"] if workloads else None,
        "dataset_noise": {row["workload"]: row["mean_over_fastest_p50_p90"]
                          for row in summary(args.data)},
        "elapsed_s": round(time.perf_counter() - start, 1),
    }
    if args.markdown:
        write_markdown(report, args.markdown, " ".join(sys.argv[1:]))
    print(json.dumps(report, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
