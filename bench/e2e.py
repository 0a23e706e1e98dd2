"""End-to-end latency of the samples and the zoo (batch 1, fp32): our build with default configs
and with tuned configs, onnxruntime, OpenVINO (fp32) and PyTorch eager, at each thread count,
in one run; plus the tuning budget each model used.

    python bench/e2e.py [--models resnet18,squeezenet1_1,...] [--threads 1,2] [--trials 32]
                        [--tune | --no-tune] [--retune] [--iterations 10] [--paired 15]
                        [--json] [--write-docs [docs/e2e.md]]

First every model is tuned (``bench/e2e_tune.py``: a real ``tuner tune`` job with xgb-transfer
on a database shared across the models, cached per model, thread count and CPU class, so a
rerun only measures). Then each engine runs each model in a fresh process at the thread count:
ours through ``tuner run --check`` (latency, relative error against onnxruntime, step counts),
the peers through ``bench/zoo_peer.py``, PyTorch through ``bench/e2e_run.py`` (samples) or
``bench/zoo_torch.py`` (zoo, in .venv-zoo). Ratios are against the faster of onnxruntime and
OpenVINO, with geometric means per thread count; with ``--paired ROUNDS`` they come from our
builds and the peers run in turn in one process (``bench/paired.py``), the milliseconds still
from the fresh processes. The report carries the load average: numbers
taken on a busy machine are noisy.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from e2e_bf16 import bf16_rows  # noqa: E402
from e2e_int8 import int8_libraries, int8_rows, quantized_model  # noqa: E402
from e2e_models import ALL_MODELS, BenchModel, ModelUnavailable, kind_of, model_file  # noqa: E402
from e2e_report import ratios, summary, write_docs  # noqa: E402
from e2e_tune import MAX_TRIALS, TUNER, TuningFailed, cached, ensure_tuned, reset  # noqa: E402
from zoo import ZOO_PYTHON, ZooError, build, call, check_exporter, host, run_ours, run_peer  # noqa: E402

logger = logging.getLogger("e2e")
PEERS = ("onnxruntime", "openvino")


def run_torch(model: BenchModel, threads: int, iterations: int, zoo_python: Path
              ) -> dict[str, Any]:
    script = ([sys.executable, str(HERE / "e2e_run.py")] if model.kind == "sample"
              else [str(zoo_python), str(HERE / "zoo_torch.py")])
    data, error, _ = call([*script, model.name, str(threads), str(iterations)], "peer")
    if data is None or "error" in data:
        return {"error": error or (data or {}).get("error", "failed")}
    return {"ms": data["median_s"] * 1e3,
            "max_abs_diff_vs_onnxruntime": data.get("max_abs_diff_vs_onnxruntime")}


def tuning_of(model: BenchModel, threads: int, args: argparse.Namespace) -> dict[str, Any]:
    """The tuned configs for one row: tuned now (or from the cache), or the cached ones only."""
    try:
        if args.tune:
            return ensure_tuned(model.name, model.path, threads, args.trials,
                                args.retune).to_json()
    except TuningFailed as e:
        logger.warning("%s", e)
        return {"error": str(e)}
    known = cached(model.name, threads, None)
    return known.to_json() if known else {"skipped": "no cached configs (run with --tune)"}


def measure_row(model: BenchModel, threads: int, tuning: dict[str, Any], default_lib: Path,
                tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    path, iterations = str(model.path), args.iterations
    engines: dict[str, Any] = {"default": run_ours(path, default_lib, threads, iterations)}
    libraries: dict[str, Any] = {}
    if "configs" in tuning:
        tuned_lib = tmp / f"tuned-t{threads}"
        libraries["tuned"] = build(path, tuned_lib, Path(tuning["configs"]), threads)
        engines["tuned"] = (run_ours(path, tuned_lib, threads, iterations)
                            if "error" not in libraries["tuned"] else libraries["tuned"])
    else:  # a tuning error is reported once, under tuning
        engines["tuned"] = {"skipped": "no tuned configs"}
    for peer in PEERS:
        engines[peer] = run_peer(peer, path, threads, iterations)
    engines["torch"] = run_torch(model, threads, iterations, args.zoo_python)
    row = {"model": model.name, "kind": model.kind, "threads": threads, "engines": engines,
           "ratios": ratios(engines), "tuning": tuning, "libraries": libraries}
    if args.paired:
        pair_row(row, path, {"default": default_lib, "tuned": tmp / f"tuned-t{threads}"},
                 args.paired)  # the libraries as built above
    return row


def pair_row(row: dict[str, Any], path: str, libraries: dict[str, Path], rounds: int) -> None:
    """``row``'s ratios from a paired run (``run_paired``) of those of its engines that ran in
    their fresh processes (a peer that failed there, as OpenVINO on a quantized BERT, would
    fail the whole paired run)."""
    engines = row["engines"]
    ours = {k: v for k, v in libraries.items() if "ms" in engines.get(k, {})}
    peers = [p for p in PEERS if "ms" in engines.get(p, {})]
    row["paired"] = run_paired(path, ours, row["threads"], rounds, peers)
    if "error" not in row["paired"]:
        row["ratios"] = ratios(paired_engines(row["paired"]))
        row["ratio_source"] = "paired"


def run_paired(path: str, ours: dict[str, Path], threads: int, rounds: int,
               peers: Sequence[str] = PEERS) -> dict[str, Any]:
    """Median ms of our libraries and the peers run in turn in one process
    (``bench/paired.py``): ratios that hold while the machine's speed changes under the run,
    which separate fresh processes do not (2-4% between them here, 20% once)."""
    engines = [str(lib) for lib in ours.values()] + list(peers)
    data, error, _ = call([sys.executable, str(HERE / "paired.py"), path, *engines,
                           "--threads", str(threads), "--rounds", str(rounds)], "peer")
    if data is None or "error" in data:
        return {"error": error or (data or {}).get("error", "failed")}
    names = {str(lib): name for name, lib in ours.items()}
    out: dict[str, Any] = {names.get(e["engine"], e["engine"]): e["median_ms"]
                           for e in data["engines"]}
    out["rounds"] = rounds
    # each engine's median over rounds of its run's time / the first engine's run of the same
    # round: the ratios that survive a change of the machine's speed inside the run
    out["ratio_to_first"] = {names.get(e["engine"], e["engine"]): e["ratio_to_first"]
                             for e in data["engines"]}
    return out


def paired_engines(paired: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The engines' times for ``ratios``, from a paired run: the first engine's median scaled
    by each one's median per-round ratio to it. Two engines' separate medians can come from
    different speed phases of the machine; a ratio of runs of the same round cannot."""
    to_first = paired.get("ratio_to_first")
    if not to_first:  # a report written before the ratios were kept
        return {k: {"ms": ms} for k, ms in paired.items() if k not in ("rounds",)}
    first = next(iter(to_first))
    return {k: {"ms": paired[first] * r} for k, r in to_first.items()}


def model_rows(model: BenchModel, tunings: dict[int, dict[str, Any]],
               args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="e2e-") as tmp:
        default_lib = Path(tmp) / "default"
        built = build(str(model.path), default_lib)
        for threads in args.threads:
            logger.info("%s: measuring at %d thread(s)", model.name, threads)
            row = measure_row(model, threads, tunings[threads], default_lib, Path(tmp), args)
            row["libraries"]["default"] = built
            rows.append(row)
    return rows


def unavailable_rows(name: str, error: str, threads: list[int]) -> list[dict[str, Any]]:
    engines = {e: {"error": error} for e in ("default", "tuned", *PEERS, "torch")}
    return [{"model": name, "kind": kind_of(name), "threads": t, "engines": engines,
             "ratios": ratios(engines), "tuning": {"error": error}, "libraries": {}}
            for t in threads]


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    models: list[BenchModel] = []
    rows: list[dict[str, Any]] = []
    for name in args.models:
        try:
            models.append(model_file(name, args.zoo_python, args.exporter))
        except ModelUnavailable as e:
            rows += unavailable_rows(name, str(e), args.threads)
    if args.tune and args.retune:
        for threads in args.threads:
            reset(threads)
    # tune everything first: measurements then run without a tuning job beside them
    tunings = {m.name: {t: tuning_of(m, t, args) for t in args.threads} for m in models}
    for model in models:
        rows += model_rows(model, tunings[model.name], args)
    if args.int8:  # the same models quantized by onnxruntime's tool (e2e_int8)
        rows += int8_model_rows(models, args)
    if args.bf16:  # the same models built with --precision bf16 (e2e_bf16)
        for model in models:
            with tempfile.TemporaryDirectory(prefix="e2e-bf16-") as tmp:
                for row in bf16_rows(model, args.threads, args.iterations, Path(tmp),
                                     args.trials if args.tune else None):
                    row["ratios"] = ratios(row["engines"])
                    rows.append(row)
    return rows


def int8_model_rows(models: list[BenchModel], args: argparse.Namespace
                    ) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for model in models:
        try:
            quantized = quantized_model(model, args.reduce_range)
        except ModelUnavailable as e:
            suffix = "int8r" if args.reduce_range else "int8"
            rows += unavailable_rows(f"{model.name}-{suffix}", str(e), args.threads)
            continue
        # tuned like the fp32 rows (its own cache entry: MODEL-int8), before measuring
        tunings = {t: tuning_of(quantized, t, args) for t in args.threads}
        with tempfile.TemporaryDirectory(prefix="e2e-int8-") as tmp:
            for row in int8_rows(quantized, args.threads, args.iterations, Path(tmp),
                                 tunings):
                row["ratios"] = ratios(row["engines"])
                if args.paired:
                    pair_row(row, str(quantized.path),
                             int8_libraries(Path(tmp), row["threads"]), args.paired)
                rows.append(row)
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ALL_MODELS))
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--trials", type=int, default=MAX_TRIALS,
                        help=f"tuning trials per task (1..{MAX_TRIALS})")
    parser.add_argument("--tune", action=argparse.BooleanOptionalAction, default=True,
                        help="tune models without cached configs (--no-tune: cached only)")
    parser.add_argument("--retune", action="store_true",
                        help="fresh tuning databases, cached configs ignored (everything "
                        "requested is tuned again)")
    parser.add_argument("--iterations", type=int, default=10, help="runs per measurement")
    parser.add_argument("--paired", type=int, default=0, metavar="ROUNDS",
                        help="also run our builds and the peers in turn in one process for "
                             "ROUNDS rounds (bench/paired.py) and take the ratios from that")
    parser.add_argument("--int8", action="store_true",
                        help="also time each model quantized by onnxruntime's quantize_static "
                             "(QDQ): ours (default configs), onnxruntime and OpenVINO int8")
    parser.add_argument("--reduce-range", action="store_true",
                        help="with --int8: 7-bit weights (quantize_static's reduce_range, "
                             "onnxruntime's advice for CPUs without VNNI), rows MODEL-int8r")
    parser.add_argument("--bf16", action="store_true",
                        help="also each model built with --precision bf16 (default configs) "
                             "against onnxruntime (fp32) and OpenVINO in bf16")
    parser.add_argument("--exporter", default="torchscript", choices=("torchscript", "dynamo"))
    parser.add_argument("--zoo-python", type=Path, default=ZOO_PYTHON)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--write-docs", nargs="?", type=Path, const=ROOT / "docs" / "e2e.md",
                        default=None, metavar="FILE", help="write the Markdown tables")
    parser.add_argument("--from-json", type=Path, metavar="REPORT",
                        help="measure nothing: write the Markdown of a saved --json report")
    args = parser.parse_args(argv)
    args.command = " ".join(argv if argv is not None else sys.argv[1:])
    try:
        args.threads = [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        parser.error(f"--threads takes comma-separated numbers, got {args.threads!r}")
    args.models = [m for m in args.models.split(",") if m]
    unknown = [m for m in args.models if m not in ALL_MODELS]
    if unknown:
        parser.error(f"unknown models {', '.join(unknown)}; choose from {', '.join(ALL_MODELS)}")
    if not 1 <= args.trials <= MAX_TRIALS:
        parser.error(f"--trials must be within 1..{MAX_TRIALS} (the issue's budget)")
    if args.paired < 0:
        parser.error("--paired takes a number of rounds (0: off)")
    if args.iterations < 1 or not args.threads or min(args.threads) < 1:
        parser.error("--iterations and every --threads count must be at least 1")
    return args


def docs_from_json(report: Path, docs: Path) -> int:
    try:
        saved = json.loads(report.read_text())
    except (OSError, ValueError) as e:
        print(f"error: cannot read {report}: {e}", file=sys.stderr)
        return 2
    write_docs(saved, docs)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json is not None:
        return docs_from_json(args.from_json, args.write_docs or ROOT / "docs" / "e2e.md")
    logging.basicConfig(level=logging.WARNING if args.json else logging.INFO,
                        format="%(asctime)s %(message)s", stream=sys.stderr)
    if any(kind_of(m) == "zoo" for m in args.models):
        try:
            check_exporter(args.zoo_python)
        except ZooError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    started = host()  # the load average before this run adds its own
    rows = run(args)
    report = {"command": args.command, "host": started, "threads": args.threads,
              "iterations": args.iterations, "exporter": args.exporter, "tuner": TUNER,
              "trials_per_task": args.trials, "rows": rows, "summary": summary(rows)}
    report["load_average_end"] = list(os.getloadavg())
    if args.write_docs is not None:
        write_docs(report, args.write_docs)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_summary(report)
    return 0


def print_summary(report: dict[str, Any]) -> None:
    for row in report["rows"]:
        e, r = row["engines"], row["ratios"]
        ms = "  ".join(f"{k} {e[k]['ms']:.2f}" if "ms" in e[k] else f"{k} err" for k in e)
        best = r["tuned_vs_best"]
        print(f"{row['model']:<20} @{row['threads']}  {ms}  tuned vs best peer "
              f"{'n/a' if best is None else f'{best:.2f}'}")
    for s in report["summary"]:
        gm = s["geomean_tuned_vs_best"]
        print(f"{s['kind']} @{s['threads']}: geomean tuned vs best peer "
              f"{'n/a' if gm is None else f'{gm:.2f}'}, faster than both on "
              f"{s['tuned_beats_both']}/{s['models']}")
    print(f"load average {report['host']['load_average']} at start: other work adds noise")


if __name__ == "__main__":
    sys.exit(main())
