"""``tuner tune MODEL.onnx`` (a whole model, on the embedded service) and ``tuner tune KEY``
(one workload, in this process).

A model is tuned by an ordinary job on an embedded SQLite server in the output directory, with
local workers; rerunning the same command resumes it (see ``tuning/model_job.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
#: seconds a local worker may take to start (it measures the CPU's peak first)
STARTUP_S = 60.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "tune", help="tune a whole ONNX model (or one workload key) on this machine",
        description="MODEL.onnx: extract its tasks, start local workers, tune every task with "
        "the job machinery on an embedded SQLite database in OUT (rerun to resume), write "
        "OUT/configs.json and OUT/records.jsonl. A workload key (dense:M=64,N=64,K=64) is "
        "tuned alone, in this process.")
    p.add_argument("model", metavar="MODEL.onnx|WORKLOAD")
    p.add_argument("--trials", "--trials-per-task", dest="trials", type=int, default=64,
                   help="measurements per task (default 64)")
    p.add_argument("--tuner", default=None,
                   help="random|grid|ga|xgb|xgb-transfer (default: xgb-transfer for a model, "
                   "xgb for a workload)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads per timed kernel (default: all cores for a model, 1 for a "
                   "workload)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    model = p.add_argument_group("a model")
    model.add_argument("-o", "--output", type=Path, default=None, metavar="OUT",
                       help="output directory (default: MODEL-tuned next to the model)")
    model.add_argument("--workers", type=int, default=1,
                       help="local workers (default 1; more overlap their timed runs)")
    model.add_argument("--parallel-build", type=int, default=None, metavar="P",
                       help="candidates each worker compiles at once (default: all cores); "
                       "timed runs never overlap a compile")
    model.add_argument("--layout", choices=("nchw", "nchwc", "auto"), default="auto",
                       help="the library layout to tune for, as tuner build --layout: nchw "
                       "(plain), nchwc (conv layers as blocked workloads with this CPU's "
                       "block) or auto (both, the default: the build times both plans)")
    model.add_argument("--compare", action="store_true",
                       help="then build default and tuned libraries and time them against "
                       "onnxruntime")
    model.add_argument("--push", metavar="URL", help="then import the records into this server")
    model.add_argument("--token", help="token for --push (default: TUNER_TOKEN)")
    model.add_argument("--port", type=int, default=0,
                       help="port of the embedded server and dashboard (default: any free)")
    one = p.add_argument_group("a workload key")
    one.add_argument("--target", default="llvm")
    one.add_argument("--seed", type=int, default=0)
    one.add_argument("--batch", type=int, default=8)
    one.add_argument("--records", metavar="FILE",
                     help="xgb-transfer: measurement records (JSON lines from GET "
                     "/api/v1/records, --save-records or AutoTVM logs) of other workloads")
    one.add_argument("--save-records", metavar="FILE",
                     help="append every measured config to FILE as JSON lines")
    p.set_defaults(func=cmd_tune)


def is_model_path(text: str) -> bool:
    return text.lower().endswith(".onnx") or (":" not in text and Path(text).exists())


def cmd_tune(args: argparse.Namespace) -> int:
    if args.trials < 1:
        print("error: --trials must be at least 1", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not is_model_path(args.model):
        from tuner_service.cli.kernels import tune_workload

        args.workload = args.model
        args.tuner = args.tuner or "xgb"
        args.threads = args.threads or 1
        return tune_workload(args)
    return tune_model_command(args)


def _options(args: argparse.Namespace) -> Any:
    from tuner_service.tuning.embedded import LocalWorkers
    from tuner_service.tuning.model_job import TuneOptions

    cores = os.cpu_count() or 1
    workers = LocalWorkers(count=args.workers, threads=args.threads,
                           parallel_build=args.parallel_build or cores,
                           verbose=getattr(args, "verbose", False))
    push = None
    if args.push:
        push = (args.push, args.token or os.environ.get("TUNER_TOKEN"))
    return TuneOptions(trials_per_task=args.trials, tuner=args.tuner or "xgb-transfer",
                       workers=workers, threads=args.threads or cores, port=args.port,
                       push=push, layout=args.layout)


def _check_args(args: argparse.Namespace) -> str | None:
    from tuner_service.tuners import tuner_names

    if args.tuner is not None and args.tuner not in tuner_names():
        return f"unknown tuner {args.tuner!r}; choose from {', '.join(tuner_names())}"
    if args.workers < 1 or (args.parallel_build is not None and args.parallel_build < 1):
        return "--workers and --parallel-build must be at least 1"
    if args.target != "llvm":
        return "tuner tune MODEL.onnx measures on this machine's CPU (target llvm); " \
               "for a GPU use `tuner submit` with a CUDA worker"
    if not Path(args.model).is_file():
        return f"cannot read {args.model}: no such file"
    return _check_model(Path(args.model))


def _check_model(path: Path) -> str | None:
    """Read the model here first: a bad file is reported before any server starts."""
    from tuner_service.compiler.frontend.errors import ModelError
    from tuner_service.compiler.frontend.extract import extract_tasks

    try:
        result = extract_tasks(path)  # a path: external data is read from its folder
    except ModelError as e:
        return f"{path}: {e}"
    if not result.tasks:
        return f"{path}: no layer can be tuned (`tuner extract {path}` lists why)"
    return None


def tune_model_command(args: argparse.Namespace) -> int:
    from tuner_service.tuning.model_job import TuneError, tune_model

    problem = _check_args(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    model = Path(args.model)
    output = args.output or model.with_name(model.stem + "-tuned")
    view = _LiveView(quiet=args.json)
    try:
        with view:
            result = tune_model(model, output, _options(args), view.start, view.update)
    except TuneError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT if "cannot read" in str(e) else EXIT_FAILED
    except KeyboardInterrupt:
        print(f"\ninterrupted: rerun the same command to resume (log: {output / 'tuner.db'})",
              file=sys.stderr)
        return 130
    comparison = _compare(args, model, result) if args.compare and result.ok else None
    _report(args, result, comparison)
    return 0 if result.ok else EXIT_FAILED


def _compare(args: argparse.Namespace, model: Path, result: Any) -> Any:
    from tuner_service.tuning.compare import compare

    if not args.json:
        print("building the default and the tuned library, timing them and onnxruntime...",
              flush=True)
    return compare(model.read_bytes(), result.configs, result.output,
                   args.threads or os.cpu_count() or 1, layout=args.layout)


def _report(args: argparse.Namespace, result: Any, comparison: Any) -> None:
    if args.json:
        body = {"job_id": result.job_id, "status": result.progress.status,
                "origin": result.origin, "output": str(result.output),
                "configs": str(result.configs), "records": str(result.records),
                "estimated_latency_s": result.progress.estimated_latency_s,
                "unsupported": list(result.unsupported), "pushed": result.pushed,
                "tasks": [vars(t) for t in result.progress.tasks]}
        if comparison is not None:
            body["comparison"] = {"default_ms": comparison.default_ms,
                                  "tuned_ms": comparison.tuned_ms,
                                  "onnxruntime_ms": comparison.onnxruntime_ms,
                                  "max_rel_error": comparison.max_rel_error,
                                  "library": str(comparison.library)}
        print(json.dumps(body, indent=2))
        return
    for item in result.unsupported:
        print(f"not tuned (runs in numpy): {item}")
    if comparison is not None:
        print("\n".join(comparison.lines()))
    print(f"configs: {result.configs}\nrecords: {result.records}")
    if result.pushed is not None:
        print(f"pushed to {args.push}: {result.pushed}")
    if comparison is not None:
        print(f"tuned library: {comparison.library}  (tuner run {args.model} --library "
              f"{comparison.library} --check)")
    else:
        print(f"next: tuner build {args.model} --configs {result.configs} -o "
              f"{result.output / 'lib'}")


class _LiveView:
    """Live per-task table on a terminal, a progress line every 10 s when redirected."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self._live: Any = None
        self._last = 0.0
        self._line = ""
        self._started = time.monotonic()

    def __enter__(self) -> _LiveView:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()

    def start(self, url: str, job: Any, origin: str) -> None:
        if self.quiet:
            return
        self._started = time.monotonic()
        what = {"new": "tuning", "resumed": "resuming", "reused": "already tuned:"}[origin]
        print(f"{what} job {job.id}; dashboard while it runs: {url}/jobs/{job.id}", flush=True)

    def update(self, progress: Any) -> None:
        from tuner_service.cli import tables

        if self.quiet:
            return
        if progress.health and progress.health.startswith("no worker online") and \
                time.monotonic() - self._started < STARTUP_S:
            # the local worker measures the CPU's peak before it registers
            progress = dataclasses.replace(progress, health="starting the local worker")
        if tables.interactive():
            if self._live is None:
                from rich.live import Live

                self._live = Live(tables.rich_table(progress), refresh_per_second=2)
                self._live.start()
            self._live.update(tables.rich_table(progress))
            return
        if progress.finished:
            print(tables.plain_table(progress), flush=True)
            return
        line = f"{progress.trials_done}/{progress.trials_budget} trials" + (
            f" (note: {progress.health})" if progress.health else "")
        quiet_for = time.monotonic() - self._last
        if (line != self._line and quiet_for >= 10) or quiet_for >= 60:
            print(line, flush=True)
            self._line, self._last = line, time.monotonic()
