"""Tuned configs for the end-to-end benchmark: a quick local tuning of every task of the sample
models, cached as a tuning-log list (``bench/data/e2e-configs-t{T}.json``) that ``tuner build
--configs`` reads. A task already in the cache with at least the requested trials is skipped;
the cache is rewritten after every task, so an interrupted run resumes where it stopped.

    python bench/e2e_tune.py --threads 2 --trials 32 [--models resnet18,...] [--retune]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see tuner_service/cli/main.py

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from schedule_templates.records import MeasureOptions
from schedule_templates.templates.base import get_template
from schedule_templates.workloads import Workload
from tuner_service.frontend.extract import extract_tasks
from tuner_service.frontend.samples import SAMPLE_MODELS, build_sample_model
from tuner_service.tuners import make_tuner
from tuner_service.tuning.isolated import IsolatedMeasure
from tuner_service.tuning.local_loop import best_trial, tune

HERE = Path(__file__).resolve().parent
logger = logging.getLogger("e2e_tune")


def cache_path(threads: int) -> Path:
    return HERE / "data" / f"e2e-configs-t{threads}.json"


def model_tasks(models: list[str]) -> list[Workload]:
    """Distinct tunable workloads of the models, heaviest first (best use of a cut-short run).

    Fused workloads are tuned as their base workload: same search space, and ``tuner build``
    falls back to the base key's record, so one tuning serves every epilogue variant."""
    seen: dict[str, tuple[Workload, int]] = {}
    for name in models:
        for task in extract_tasks(build_sample_model(name)).tasks:
            base = task.workload.base_workload()
            known = seen.get(base.key)
            seen[base.key] = (base, task.weight + (known[1] if known else 0))
    ranked = sorted(seen.values(), key=lambda wt: -wt[0].flops() * wt[1])
    return [w for w, _ in ranked]


def tune_task(workload: Workload, threads: int, trials: int, tuner_name: str,
              seed: int) -> dict[str, Any] | None:
    template = get_template(workload.op)
    tuner = make_tuner(tuner_name, workload, template.space(workload), seed)
    options = MeasureOptions(number=1, repeat=3, min_repeat_ms=20.0)
    start = time.perf_counter()
    with IsolatedMeasure(workload.key, template.name, "llvm", threads, options) as measure:
        history = tune(workload, tuner, trials, measure, batch=8,
                       initial=[template.default_config(workload).index])
    best = best_trial(history)
    if best is None:
        return None
    return {
        "workload": workload.key, "target": "llvm", "template": template.name,
        "template_version": template.version, "config": best.config.to_json(),
        "mean_cost": best.result.mean_cost, "gflops": best.gflops,
        "default_gflops": history[0].gflops, "trials": len(history), "threads": threads,
        "tuning_s": time.perf_counter() - start,
    }


def ensure_tuned(models: list[str], threads: int, trials: int, retune: bool = False,
                 tuner_name: str = "xgb", seed: int = 0) -> Path:
    path = cache_path(threads)
    entries: dict[str, dict[str, Any]] = {}
    if path.exists() and not retune:
        entries = {e["workload"]: e for e in json.loads(path.read_text())}
    tasks = model_tasks(models)
    for number, workload in enumerate(tasks, start=1):
        known = entries.get(workload.key)
        if known is not None and known.get("trials", 0) >= trials:
            continue
        logger.info("tuning %d/%d %s (%d trials, %d threads)", number, len(tasks),
                    workload.key, trials, threads)
        entry = tune_task(workload, threads, trials, tuner_name, seed)
        if entry is None:
            logger.warning("no config of %s ran successfully", workload.key)
            continue
        entries[workload.key] = entry
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(list(entries.values()), indent=1) + "\n")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(SAMPLE_MODELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--tuner", default="xgb")
    parser.add_argument("--retune", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    path = ensure_tuned(args.models.split(","), args.threads, args.trials, args.retune,
                        args.tuner)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
