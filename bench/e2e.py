"""End-to-end latency of the sample models (batch 1, fp32): our kernels with default configs,
with tuned configs, onnxruntime and PyTorch eager, at the same thread counts, in one run.

    python bench/e2e.py [--json] [--models resnet18,mobilenet_v2,bert_block] [--threads 1,2]
                        [--trials 32] [--retune] [--iterations 30]

Tuned configs come from a quick local tuning of every task of the models (``bench/e2e_tune.py``,
``--trials`` per task, at each thread count), cached under ``bench/data/`` so reruns only
measure. Every measurement runs in a fresh process (``bench/e2e_run.py``) with the thread
count set for that runtime alone (onnxruntime: intra_op_num_threads; PyTorch: set_num_threads;
ours: the kernels' libgomp thread count). The machine is shared: the report carries the load
average, and numbers taken under load are noisy.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_tune import cache_path, ensure_tuned

from tuner_service.deploy.configs import ConfigBook, load_configs_file
from tuner_service.deploy.library import build_library
from tuner_service.frontend.samples import SAMPLE_MODELS, build_sample_model

HERE = Path(__file__).resolve().parent
ENGINES = ("default", "tuned", "onnxruntime", "torch")


def measure(engine: str, model: str, threads: int, iterations: int,
            library: Path | None = None, nice: int = 0) -> dict[str, Any]:
    kind = "ours" if engine in ("default", "tuned") else engine
    prefix = ["nice", "-n", str(nice)] if nice else []
    command = [*prefix, sys.executable, str(HERE / "e2e_run.py"), kind, model, str(threads),
               str(iterations)] + ([str(library)] if library else [])
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["failed"])[-1]
        return {"error": reason[-300:]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def build(model: str, book: ConfigBook, out: Path, threads: int) -> dict[str, int]:
    manifest = build_library(build_sample_model(model), book, out, threads=threads)
    kernels = manifest["kernels"]
    return {"kernels": len(kernels), "tuned": sum(k["config_source"] == "tuned" for k in kernels),
            "layers": len(manifest["layers"])}


def row(model: str, threads: int, results: dict[str, dict[str, Any]],
        library: dict[str, int]) -> dict[str, Any]:
    ms = {e: results[e]["median_s"] * 1e3 if "median_s" in results[e] else None for e in ENGINES}
    out: dict[str, Any] = {"model": model, "threads": threads}
    out.update({f"{e}_ms": ms[e] for e in ENGINES})
    out.update({f"{e}_p90_ms": results[e].get("p90_s", 0) * 1e3 or None for e in ENGINES})
    # under contention the fastest run is the best estimate of the quiet-machine latency
    out.update({f"{e}_min_ms": results[e].get("min_s", 0) * 1e3 or None for e in ENGINES})
    for other in ("default", "onnxruntime", "torch"):
        both = ms["tuned"] is not None and ms[other] is not None
        out[f"tuned_speedup_vs_{other}"] = ms[other] / ms["tuned"] if both else None
    out["errors"] = {e: r["error"] for e, r in results.items() if "error" in r} or None
    out["max_abs_diff_vs_onnxruntime"] = {
        e: r.get("max_abs_diff_vs_onnxruntime") for e, r in results.items() if "error" not in r}
    out["library"] = library
    return out


def print_table(rows: list[dict[str, Any]]) -> None:
    def fmt(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f}"

    print(f"{'model':<14}{'thr':>4}{'default':>10}{'tuned':>10}{'ort':>10}{'torch':>10}"
          f"{'tuned/def':>11}{'vs ort':>9}{'vs torch':>10}   (ms, medians)")
    for r in rows:
        print(f"{r['model']:<14}{r['threads']:>4}{fmt(r['default_ms']):>10}"
              f"{fmt(r['tuned_ms']):>10}{fmt(r['onnxruntime_ms']):>10}{fmt(r['torch_ms']):>10}"
              f"{fmt(r['tuned_speedup_vs_default']):>11}"
              f"{fmt(r['tuned_speedup_vs_onnxruntime']):>9}"
              f"{fmt(r['tuned_speedup_vs_torch']):>10}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(SAMPLE_MODELS))
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--trials", type=int, default=32, help="tuning trials per task")
    parser.add_argument("--retune", action="store_true", help="ignore the cached configs")
    parser.add_argument("--no-tune", action="store_true",
                        help="use the cached configs as they are, tune nothing")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--nice", type=int, default=0,
                        help="run the measurements at this niceness (negative: above other "
                        "work on a shared machine; needs the privilege)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING if args.json else logging.INFO,
                        format="%(asctime)s %(message)s")
    models = args.models.split(",")
    thread_counts = [int(t) for t in args.threads.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="e2e-") as tmp:
        for threads in thread_counts:
            configs = cache_path(threads)
            if not args.no_tune:
                configs = ensure_tuned(models, threads, args.trials, args.retune)
            book = (load_configs_file(configs) if configs.exists() else ConfigBook())
            for model in models:
                default_dir = Path(tmp) / f"{model}-default"
                if not default_dir.exists():
                    build(model, ConfigBook(), default_dir, threads)
                tuned_dir = Path(tmp) / f"{model}-tuned-t{threads}"
                library = build(model, book, tuned_dir, threads)
                libraries = {"default": default_dir, "tuned": tuned_dir}
                results = {e: measure(e, model, threads, args.iterations, libraries.get(e),
                                      args.nice) for e in ENGINES}
                rows.append(row(model, threads, results, library))
    report = {"rows": rows, "trials_per_task": args.trials, "nice": args.nice,
              "load_average": os.getloadavg(), "cpu_count": os.cpu_count()}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(rows)
        print(f"load average {report['load_average']}: other work on this machine adds noise")
    return 0


if __name__ == "__main__":
    sys.exit(main())
