"""The model zoo: popular models exported as a user would, compiled and run with our kernels.

    python bench/zoo.py [--threads 1,2] [--json] [--models resnet50,...]
                        [--exporters torchscript,dynamo] [--iterations 5] [--no-docs]

Each model (torchvision classification nets of several families and a transformers BERT built
from its config, random weights, batch 1, fp32) is exported by ``bench/zoo_export.py`` in the
exporter environment (``bash scripts/zoo_env.sh`` creates ``.venv-zoo``: PyPI's torchvision does
not import beside the main .venv's torch) through the TorchScript and the dynamo exporter,
cached under ``bench/.zoo-cache/``. Then, as a user would and with the same commands:
``tuner extract`` (tasks, unsupported layers), ``tuner build`` with default configs (build
time), and at every thread count ``tuner run --check`` (latency, max relative error against
onnxruntime) beside onnxruntime and OpenVINO (``bench/zoo_peer.py``), each in a fresh process.
Writes the table to ``docs/zoo.md`` (unless ``--no-docs``) and, with ``--json``, the full
results to stdout. Any stage that fails is recorded with its error; the zoo goes on.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from zoo_report import write_docs  # noqa: E402

logger = logging.getLogger(__name__)

MODELS = ("resnet50", "mobilenet_v3_large", "efficientnet_b0", "densenet121",
          "shufflenet_v2_x1_0", "regnet_y_400mf", "convnext_tiny", "vit_b_16", "squeezenet1_1",
          "bert_base")
EXPORTERS = ("torchscript", "dynamo")
PEERS = ("onnxruntime", "openvino")
CACHE = HERE / ".zoo-cache"
ZOO_PYTHON = ROOT / ".venv-zoo" / "bin" / "python"
TIMEOUT_S = {"export": 1800, "extract": 600, "build": 3600, "run": 1800, "peer": 900,
             "tune": 3600}


class ZooError(Exception):
    """The zoo cannot start (no exporter environment)."""


def tuner_command() -> list[str]:
    script = Path(sys.executable).parent / "tuner"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tuner_service.cli.main"]


def call(command: list[str], stage: str, env: dict[str, str] | None = None
         ) -> tuple[dict[str, Any] | None, str, float]:
    """(JSON of the last stdout line, or None; the error line; seconds). ``env``: the child's
    whole environment (default: ours)."""
    started = time.perf_counter()
    env = {**(os.environ if env is None else env), "OPENBLAS_NUM_THREADS": "1"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False, env=env,
                              timeout=TIMEOUT_S[stage])
    except subprocess.TimeoutExpired:
        return None, f"{stage} timed out after {TIMEOUT_S[stage]} s", TIMEOUT_S[stage]
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return None, (lines[-1] if lines else f"exit status {done.returncode}")[-400:], seconds
    try:
        return json.loads(done.stdout), "", seconds
    except json.JSONDecodeError:
        last = done.stdout.strip().splitlines()[-1:] or ["{}"]
        return json.loads(last[0]), "", seconds


def export(model: str, exporter: str, python: Path, refresh: bool) -> dict[str, Any]:
    """The cached export of ``model`` (exported now when missing or ``refresh``)."""
    folder = CACHE / f"{model}-{exporter}"
    report = folder / "export.json"
    if report.exists() and not refresh:
        return dict(json.loads(report.read_text()), path=str(folder / "model.onnx"))
    logger.info("exporting %s with the %s exporter", model, exporter)
    data, error, _ = call([str(python), str(HERE / "zoo_export.py"), model, exporter,
                           str(folder)], "export")
    if data is None:
        return {"ok": False, "error": error}
    return dict(data, path=str(folder / "model.onnx"))


def extract(path: str) -> dict[str, Any]:
    data, error, _ = call([*tuner_command(), "extract", path, "--json"], "extract")
    if data is None:
        return {"error": error}
    reasons: dict[str, int] = {}
    for item in data["unsupported"]:
        reason = f"{item['op']}: {item['reason']}"
        reasons[reason] = reasons.get(reason, 0) + 1
    return {"tasks": len(data["tasks"]), "layers": sum(t["weight"] for t in data["tasks"]),
            "unsupported": len(data["unsupported"]), "unsupported_reasons": reasons}


def build(path: str, out: Path, configs: Path | None = None, threads: int | None = None,
          precision: str = "fp32") -> dict[str, Any]:
    """``tuner build`` of ``path`` into ``out`` (default configs unless ``configs``)."""
    command = [*tuner_command(), "build", path, "-o", str(out), "--json", "--precision",
               precision]
    command += ["--configs", str(configs)] if configs is not None else []
    command += ["--threads", str(threads)] if threads is not None else []
    data, error, seconds = call(command, "build")
    if data is None:
        return {"error": error}
    return {"build_s": round(seconds, 1), "kernels": data["kernels"], "layers": data["layers"],
            "tuned_kernels": data.get("tuned", 0) + data.get("int8_tuned", 0),
            "bf16_layers": data.get("bf16_layers", 0),
            "int8_arithmetic": data.get("int8_arithmetic", "exact")}


def run_ours(path: str, library: Path, threads: int, iterations: int) -> dict[str, Any]:
    data, error, _ = call([*tuner_command(), "run", path, "--library", str(library),
                           "--threads", str(threads), "--iterations", str(iterations),
                           "--warmup", "1", "--check", "--json"], "run")
    if data is None:
        return {"error": error}
    # every step count the runner reports (kernel layers, numpy steps, generated operators)
    steps = {k: v for k, v in data.items() if k.endswith(("_steps", "_layers"))}
    return {"ms": data["latency_ms"]["median"],
            "max_rel_error": data["check"]["max_rel_error"], **steps,
            "reference_evaluator": {r["op"]: round(r["share"], 4)
                                    for r in data.get("reference_evaluator", [])}}


def run_peer(engine: str, path: str, threads: int, iterations: int) -> dict[str, Any]:
    data, error, _ = call([sys.executable, str(HERE / "zoo_peer.py"), engine, path,
                           str(threads), str(iterations)], "peer")
    if data is None or "error" in data:
        return {"error": error or (data or {}).get("error", "failed")}
    return {"ms": data["median_s"] * 1e3}


def zoo_entry(model: str, exporter: str, args: argparse.Namespace) -> dict[str, Any]:
    entry: dict[str, Any] = {"model": model, "exporter": exporter}
    exported = export(model, exporter, args.zoo_python, args.reexport)
    entry["torch"] = exported.get("torch")
    if not exported.get("ok"):
        return dict(entry, stage="export", error=exported.get("error", "export failed"))
    path = exported["path"]
    entry["extract"] = extract(path)
    with tempfile.TemporaryDirectory(prefix="zoo-lib-") as tmp:
        entry["build"] = build(path, Path(tmp))
        if "error" in entry["build"]:
            return dict(entry, stage="build", error=entry["build"]["error"])
        entry["runs"] = {}
        for threads in args.threads:
            logger.info("%s (%s): running at %d thread(s)", model, exporter, threads)
            row = {"ours": run_ours(path, Path(tmp), threads, args.iterations)}
            for engine in PEERS:
                row[engine] = run_peer(engine, path, threads, args.iterations)
            entry["runs"][str(threads)] = row
    errors = [r["ours"]["error"] for r in entry["runs"].values() if "error" in r["ours"]]
    if errors:
        return dict(entry, stage="run", error=errors[0])
    return dict(entry, stage="ok")


def host() -> dict[str, Any]:
    import platform

    try:
        import llvmlite.binding as llvm

        cpu = llvm.get_host_cpu_name()
    except ImportError:
        cpu = platform.processor()
    return {"cpu": cpu, "cores": os.cpu_count(), "load_average": list(os.getloadavg()),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "versions": {name: _version(name) for name in ("onnx", "onnxruntime", "openvino")}}


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--exporters", default=",".join(EXPORTERS))
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--no-docs", action="store_true", help="do not write docs/zoo.md")
    parser.add_argument("--reexport", action="store_true", help="ignore cached exports")
    parser.add_argument("--zoo-python", type=Path, default=ZOO_PYTHON,
                        help="interpreter of the exporter environment")
    args = parser.parse_args(argv)
    try:
        args.threads = [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        parser.error(f"--threads takes comma-separated numbers, got {args.threads!r}")
    args.models = [m for m in args.models.split(",") if m]
    args.exporters = [e for e in args.exporters.split(",") if e]
    unknown = sorted(set(args.models) - set(MODELS)) + sorted(set(args.exporters) -
                                                              set(EXPORTERS))
    if unknown:
        parser.error(f"unknown models or exporters: {', '.join(unknown)}")
    return args


def check_exporter(python: Path) -> None:
    probe = [str(python), "-c", "import torch, torchvision, transformers, onnxscript"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, check=False, timeout=300)
    except OSError:
        done = None
    if done is None or done.returncode != 0:
        raise ZooError(f"the exporter environment {python} is missing or incomplete: create it "
                       "with `bash scripts/zoo_env.sh`")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    try:
        check_exporter(args.zoo_python)
    except ZooError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    results = {"host": host(), "threads": args.threads, "iterations": args.iterations,
               "models": []}
    for model in args.models:
        for exporter in args.exporters:
            entry = zoo_entry(model, exporter, args)
            logger.info("%s (%s): %s", model, exporter, entry.get("error") or "ok")
            results["models"].append(entry)
            results["host"]["versions"].setdefault("torch (exporter)", entry.get("torch"))
    if not args.no_docs:
        write_docs(results, ROOT / "docs" / "zoo.md")
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
