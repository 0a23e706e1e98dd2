"""Tuned configs for the end-to-end benchmark, from real jobs: the path ``tuner tune MODEL.onnx``
takes (``tuning/model_job.py``: an embedded server, a local worker, the job driver), with the
``xgb-transfer`` tuner, at the thread count being measured.

One SQLite database per thread count (``bench/.e2e-cache/tuning-t{T}/tuner.db``) is kept across
models, so every model's tasks start from the shared log the earlier models warmed, as on a
shared server. (Not one for all thread counts: a job is found again by model, tuner and trials,
not threads, so a 2-thread run would reuse the 1-thread job.) The configs a job ends with are
copied to ``bench/.e2e-cache/configs/`` under (model, threads, CPU device class) with the
budget it used (trials measured, wall seconds), so a rerun only measures.

    python bench/e2e_tune.py MODEL.onnx --name NAME --threads 2 --trials 32
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see tuner_service/cli/main.py

import argparse
import dataclasses
import json
import logging
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from tuner_service.tuning.embedded import LocalWorkers
from tuner_service.tuning.model_job import TuneError, TuneOptions, tune_model
from workers.hardware import device_class

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".e2e-cache"
TUNER = "xgb-transfer"
#: the issue's budget: at most 32 measurements per task
MAX_TRIALS = 32
logger = logging.getLogger("e2e_tune")


class TuningFailed(Exception):
    """A model's job did not finish (the message says why)."""


@dataclasses.dataclass(frozen=True)
class Tuning:
    """The configs of one (model, threads, device class) and the budget spent on them."""

    configs: Path
    trials_per_task: int
    #: measurements the job made (all tasks), and its wall time
    trials: int
    wall_s: float
    tasks: int
    #: tasks that ended with a config that ran (the others build with their defaults)
    tuned_tasks: int
    job_id: int
    #: "cache" (this run measured nothing), else the job's origin: new, resumed, reused
    origin: str

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "configs": str(self.configs)}


def device_slug() -> str:
    """This CPU's device class as a file-name part (cpu_intel_..._2c)."""
    fields = dataclasses.astuple(device_class({}))
    return re.sub(r"[^a-z0-9.-]+", "_", "_".join(map(str, fields)).lower())


def cache_files(model: str, threads: int) -> tuple[Path, Path]:
    stem = CACHE / "configs" / f"{model}-t{threads}-{device_slug()}"
    return stem.with_suffix(".json"), stem.with_suffix(".meta.json")


def cached(model: str, threads: int, trials: int | None) -> Tuning | None:
    """The cached tuning of ``model`` (with exactly ``trials`` per task, unless None)."""
    configs, meta = cache_files(model, threads)
    if not (configs.exists() and meta.exists()):
        return None
    try:
        data = json.loads(meta.read_text())
        if trials is not None and data["trials_per_task"] != trials:
            return None
        return Tuning(**{**data, "configs": configs, "origin": "cache"})
    except (ValueError, KeyError, TypeError):  # written by an older version: tune again
        logger.info("ignoring %s: not a tuning record of this version", meta)
        return None


def tune(model: str, path: Path, threads: int, trials: int) -> Tuning:
    """Tune ``model`` (its ONNX file at ``path``) with a job on the shared database now."""
    options = TuneOptions(trials_per_task=trials, tuner=TUNER, threads=threads, workers=
                          LocalWorkers(count=1, threads=threads,
                                       parallel_build=os.cpu_count() or 1))
    logger.info("tuning %s at %d thread(s), %d trials per task, %s", model, threads, trials,
                TUNER)
    started = time.perf_counter()
    try:
        result = tune_model(path, CACHE / f"tuning-t{threads}", options)
    except TuneError as e:
        raise TuningFailed(f"{model}: {e}") from e
    wall_s = time.perf_counter() - started
    if not result.ok:
        raise TuningFailed(f"{model}: job {result.job_id} ended {result.progress.status}: "
                           f"{result.progress.message}")
    tasks = json.loads(result.configs.read_text())["tasks"]
    tuned_tasks = sum(1 for task in tasks if task.get("config") is not None)
    if not tuned_tasks:
        raise TuningFailed(f"{model}: job {result.job_id} ended with no working config in any "
                           f"task (see {result.output}/worker-1.log)")
    configs, meta = cache_files(model, threads)
    configs.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(result.configs, configs)
    known = cached(model, threads, trials) if result.origin == "reused" else None
    tuning = Tuning(configs, trials, result.progress.trials_done,
                    known.wall_s if known else round(wall_s, 1), len(tasks), tuned_tasks,
                    result.job_id, result.origin)
    meta.write_text(json.dumps({k: v for k, v in tuning.to_json().items()
                                if k not in ("configs", "origin")}, indent=1) + "\n")
    return tuning


def reset(threads: int) -> None:
    """Start the tuning database of ``threads`` afresh: a finished job with the same model and
    settings would otherwise be reused rather than measured again."""
    shutil.rmtree(CACHE / f"tuning-t{threads}", ignore_errors=True)


def ensure_tuned(model: str, path: Path, threads: int, trials: int, retune: bool) -> Tuning:
    if not retune:
        hit = cached(model, threads, trials)
        if hit is not None:
            return hit
    return tune(model, path, threads, trials)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, metavar="MODEL.onnx")
    parser.add_argument("--name", help="cache name (default: the file's stem)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--trials", type=int, default=MAX_TRIALS)
    parser.add_argument("--retune", action="store_true",
                        help="a fresh tuning database for this thread count, cache ignored")
    args = parser.parse_args()
    if not 1 <= args.trials <= MAX_TRIALS:
        parser.error(f"--trials must be within 1..{MAX_TRIALS}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.retune:
        reset(args.threads)
    try:
        tuning = ensure_tuned(args.name or args.model.stem, args.model, args.threads,
                              args.trials, args.retune)
    except TuningFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(tuning.to_json(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
