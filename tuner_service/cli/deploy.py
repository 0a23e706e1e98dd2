"""``tuner build`` and ``tuner run``: compile a model's tuned kernels into a shared library,
then run the model with it (kernels for the tunable layers, numpy for the rest).

Thread count: kernels take it as an argument and run their parallel loops on libgomp's pool.
The configs say which count they were tuned at; ``tuner build`` records it as the library's
default (``--threads T`` overrides it, with a warning when T differs); ``tuner run`` uses it
unless ``--threads`` says otherwise, and sets ``OMP_NUM_THREADS`` to the same value.

``tuner run --inputs FILE.npz`` runs real data (arrays saved by name with ``numpy.savez``),
``--outputs OUT.npz`` saves what the model computed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from tuner_service.cli.models import add_input_shape_flag, add_int8_flag, input_shapes

logger = logging.getLogger(__name__)

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    build = subparsers.add_parser(
        "build", help="compile a model's layers with their best configs into a library",
        description="Compile every tunable layer of MODEL.onnx with its best config (the "
        "template default where none is known) into OUT/libmodel.so plus OUT/manifest.json.")
    build.add_argument("model", type=Path, metavar="MODEL.onnx")
    source = build.add_mutually_exclusive_group()
    source.add_argument("--configs", type=Path, metavar="FILE",
                        help="tuned configs: `tuner fetch` JSON, a tuning-log list, or records "
                        "/ AutoTVM JSON lines")
    source.add_argument("--server", help="read the shared tuning log of this server")
    build.add_argument("--token", help="bearer token for --server (default: TUNER_TOKEN or "
                       "the one `tuner up` saved)")
    build.add_argument("--target", default="llvm")
    build.add_argument("--device-class", default=None,
                       help="with --server: the device class whose configs to use (default: "
                       "this machine's, see `tuner log device-class`)")
    build.add_argument("--threads", type=int, default=None,
                       help="tuner run's default thread count (default: the count the "
                       "configs were tuned at, else 1)")
    build.add_argument("-o", "--output", type=Path, required=True, metavar="OUT")
    add_input_shape_flag(build)
    build.add_argument("--layout", choices=("nchw", "nchwc", "auto"), default="auto",
                       help="activation layout between conv layers: nchw (plain), nchwc "
                            "(blocked by the host's vector width), auto (build both, time "
                            "them once here, keep the faster; the plain plan alone for "
                            "models without conv layers); default auto")
    build.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                       help="bf16: dense layers (Gemm, MatMul by a constant) multiply bfloat16 "
                       "values with fp32 sums, tensors between layers stay fp32 (needs AVX-512 "
                       "BF16; about 2x on CPUs whose BF16 unit keeps pace with their FMAs, "
                       "slower on others: see docs/kernels.md); default fp32")
    add_int8_flag(build, "the library's")
    build.add_argument("--standalone", action="store_true",
                       help="also write OUT/model.program and OUT/model.weights, so that C code "
                       "runs the model through the library alone (docs/native.md)")
    build.add_argument("--json", action="store_true", help="print the manifest summary as JSON")
    build.set_defaults(func=run_build)

    run = subparsers.add_parser(
        "run", help="run a model with a kernel library and report its latency",
        description="Execute MODEL.onnx with the kernels of a `tuner build` library on random "
        "inputs (fixed seed) and report latency over N iterations.")
    run.add_argument("model", type=Path, metavar="MODEL.onnx")
    run.add_argument("--library", type=Path, required=True, metavar="OUT")
    run.add_argument("--iterations", type=int, default=20)
    run.add_argument("--warmup", type=int, default=3)
    run.add_argument("--threads", type=int, default=None,
                     help="kernel threads (default: the count recorded at build time)")
    run.add_argument("--seed", type=int, default=0)
    add_input_shape_flag(run)
    run.add_argument("--inputs", type=Path, metavar="FILE.npz",
                     help="input arrays by name (numpy.savez); default: seeded random inputs")
    run.add_argument("--outputs", type=Path, metavar="OUT.npz",
                     help="save the model's outputs (one run on the inputs) to this .npz file")
    run.add_argument("--check", action="store_true",
                     help="compare the outputs with onnxruntime's (max abs / relative error)")
    run.add_argument("--profile", action="store_true",
                     help="then time every step alone: milliseconds by kind (tuned, generated, "
                     "int8, numpy) and the slowest steps with their GFLOPS")
    run.add_argument("--json", action="store_true")
    run.set_defaults(func=run_run)


def _read_model(path: Path, args: argparse.Namespace) -> bytes | None:
    """The model as self-contained bytes: external data read from its folder, ``--input-shape``
    pinned, shape computations folded (the frontend's ``load_model``)."""
    from tuner_service.compiler.frontend.errors import ModelError
    from tuner_service.compiler.frontend.loading import load_model

    try:
        # int8_layers=False: onnxruntime (--check) reads these bytes too; the runner rewrites
        return bytes(load_model(path, input_shapes(args), int8_layers=False).SerializeToString())
    except ModelError as e:
        print(f"error: {path}: {e}", file=sys.stderr)
        return None


def run_build(args: argparse.Namespace) -> int:
    from tuner_service.compiler.deploy.errors import DeployError
    from tuner_service.compiler.deploy.layout_choice import build_with_layout
    from tuner_service.compiler.frontend.errors import FrontendError

    data = _read_model(args.model, args)
    if data is None:
        return EXIT_BAD_INPUT
    try:
        book = _config_book(args)
        if args.threads is not None and args.threads < 1:
            print("error: --threads must be at least 1", file=sys.stderr)
            return EXIT_BAD_INPUT
        manifest = build_with_layout(data, book, args.output, args.target, args.threads,
                                     input_shapes(args), layout=args.layout,
                                     precision=args.precision, int8=args.int8)
        standalone = _standalone(data, args) if args.standalone else None
    except (DeployError, FrontendError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    summary = build_summary(manifest, args.output)
    if standalone is not None:
        summary["standalone"] = standalone
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        tuned_at = summary["tuned_threads"]
        print(f"built {summary['library']}: {summary['layers']} layers, {summary['kernels']} "
              f"kernels ({summary['tuned']} tuned, {summary['default']} default configs), "
              f"{summary['generated_layers']} generated layers ({summary['generated_kernels']} "
              f"kernels), "
              + (f"{summary['int8_layers']} int8 layers ({summary['int8_tuned']} of their "
                 f"kernels tuned), " if summary["int8_layers"] else "")
              + f"layout {_layout_text(summary['layout'])}, "
              f"{summary['threads']} thread(s) by default"
              + (f" (configs tuned at {tuned_at})" if tuned_at else ""))
        if standalone is not None:
            print(f"standalone program: {standalone['program']} ({standalone['records']} "
                  f"records), weights {standalone['weights']}, activation arena "
                  f"{standalone['memory']['arena_bytes']} bytes")
    return 0


def _layout_text(layout: dict[str, Any]) -> str:
    """``nchw``, ``nchw16c`` or ``nchw16c + int8 nhwc``."""
    if layout.get("mode", "nchw") == "nchw":
        return "nchw"
    text = f"nchw{layout.get('block', '')}c"
    return text + (f" + int8 {layout['int8']}" if layout.get("int8") else "")


def _standalone(data: bytes, args: argparse.Namespace) -> dict[str, Any]:
    from tuner_service.compiler.deploy.native_export import export_model

    return export_model(data, args.output, args.threads, input_shapes(args))


def _config_book(args: argparse.Namespace) -> Any:
    from tuner_service.compiler.deploy.configs import (
        ConfigBook,
        entries_from_json,
        load_configs_file,
    )

    if args.configs is not None:
        return load_configs_file(args.configs, args.target)
    if args.server is None:
        logger.warning("no --configs or --server: every layer uses its template's default")
        return ConfigBook(target=args.target)
    from tuner_service.cli.client import ClientError, ServiceClient, resolve_server
    from tuner_service.cli.log import local_device_class
    from tuner_service.compiler.deploy.errors import ConfigSourceError

    # this device's configs: its class, else the same microarchitecture or ISA level
    params = {"device_class": args.device_class or local_device_class(args.target),
              "target": args.target, "threads": args.threads or 1, "resolve": True}
    try:
        with ServiceClient(*resolve_server(args)) as client:
            pack = client.request("GET", "/packs", params=params)
    except ClientError as e:
        raise ConfigSourceError(str(e)) from e
    return ConfigBook(entries_from_json(pack["tasks"], args.server), args.target)


def build_summary(manifest: dict[str, Any], out: Path) -> dict[str, Any]:
    kernels = manifest["kernels"]
    # the int8 kernels of quantized layers (the others in that list are their glue)
    int8_layers = [k for k in manifest.get("int8_kernels", []) if "workload" in k]
    return {
        "library": str(out / manifest["library"]),
        "manifest": str(out / "manifest.json"),
        "layers": len(manifest["layers"]),
        "kernels": len(kernels),
        "tuned": sum(k["config_source"] == "tuned" for k in kernels),
        "default": sum(k["config_source"] == "default" for k in kernels),
        "generated_layers": len(manifest.get("generated_layers", [])),
        "generated_kernels": len(manifest.get("generated", [])),
        "int8_kernels": len(manifest.get("int8_kernels", [])),
        "int8_layers": sum(len(k.get("layers", [])) for k in int8_layers),
        "int8_tuned": sum(k.get("config_source") == "tuned" for k in int8_layers),
        "layout": manifest.get("layout", {"mode": "nchw"}),
        "precision": manifest.get("precision", "fp32"),
        "int8_arithmetic": manifest.get("int8_arithmetic", "exact"),
        "bf16_layers": sum(str(layer["workload"]).split(":")[0].endswith("_bf16")
                           for layer in manifest["layers"]),
        "threads": manifest["threads"],
        "tuned_threads": manifest.get("tuned_threads"),
    }


def run_run(args: argparse.Namespace) -> int:
    data = _read_model(args.model, args)
    if data is None:
        return EXIT_BAD_INPUT
    from tuner_service.compiler.deploy.errors import DeployError, FeedError
    from tuner_service.compiler.frontend.errors import FrontendError

    try:
        report = _execute(data, args)
    except FeedError as e:  # the user's input arrays or files
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (DeployError, FrontendError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    latency = report["latency_ms"]
    print(f"{args.model.name}: median {latency['median']:.3f} ms, p90 {latency['p90']:.3f} ms "
          f"over {report['iterations']} runs, {report['threads']} thread(s), "
          f"{report['kernel_layers']} kernel layers + {report['generated_layers']} generated + "
          f"{report['numpy_steps']} numpy steps")
    if "check" in report:
        print(f"vs onnxruntime: max abs error {report['check']['max_abs_error']:.3g}, "
              f"max relative error {report['check']['max_rel_error']:.3g}")
    if "profile" in report:
        from tuner_service.compiler.deploy.profile import format_profile

        print(format_profile(report["profile"]))
    return 0


def _execute(data: bytes, args: argparse.Namespace) -> dict[str, Any]:
    from tuner_service.compiler.deploy.executor import ModelRunner
    from tuner_service.compiler.deploy.feeds import read_npz, write_npz
    from tuner_service.compiler.deploy.loader import read_manifest
    from tuner_service.compiler.deploy.timing import time_runs

    threads = _run_threads(read_manifest(args.library), args.threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # before libgomp is loaded
    from tuner_service.compiler.deploy.loader import KernelLibrary

    feeds = read_npz(args.inputs) if args.inputs is not None else None
    runner = ModelRunner(data, KernelLibrary(args.library), threads, input_shapes(args))
    feeds = runner.random_feeds(args.seed) if feeds is None else feeds
    outputs = runner.run(feeds)
    if args.outputs is not None:
        write_npz(args.outputs, outputs)
    stats = time_runs(lambda: runner.run(feeds), args.iterations, args.warmup)
    report: dict[str, Any] = {
        "model": str(args.model), "library": str(args.library), "threads": threads,
        "inputs": str(args.inputs) if args.inputs is not None else f"random (seed {args.seed})",
        "iterations": stats["iterations"],
        "latency_ms": {k[:-2]: v * 1e3 for k, v in stats.items() if k.endswith("_s")},
        "kernel_layers": len(runner.kernel_steps),
        "generated_layers": len(runner.generated_steps),
        "int8_layers": len(runner.int8_steps),
        "int8_glue_steps": len(runner.int8_glue_steps),
        "numpy_steps": (len(runner.steps) - len(runner.kernel_steps)
                        - len(runner.generated_steps) - len(runner.int8_steps)
                        - len(runner.int8_glue_steps)),
        "native_calls": (sum(s.native for s in runner.plan.segments)
                         if runner.native is not None else None),
        "activation_memory": runner.plan.memory.summary(),
        "reference_evaluator": runner.fallback_report(),
        "outputs": {name: list(value.shape) for name, value in outputs.items()},
    }
    if args.outputs is not None:
        report["outputs_file"] = str(args.outputs)
    for row in report["reference_evaluator"]:
        logger.warning("operator %s ran in onnx's reference evaluator: %d node(s), %.1f%% of "
                       "the run time", row["op"], row["nodes"], 100 * row["share"])
    if args.check:
        report["check"] = compare_with_onnxruntime(data, feeds, outputs, threads)
    if args.profile:
        from tuner_service.compiler.deploy.profile import profile_report

        report["profile"] = profile_report(runner, feeds, max(3, min(args.iterations, 10)))
    return report


def _run_threads(manifest: dict[str, Any], requested: int | None) -> int:
    """``requested`` (warning when the configs were tuned at another count), else the
    library's default."""
    from tuner_service.compiler.deploy.errors import DeployError

    if requested is None:
        return max(1, int(manifest.get("threads", 1)))
    if requested < 1:
        raise DeployError("--threads must be at least 1")
    tuned = manifest.get("tuned_threads")
    if tuned is not None and int(tuned) != requested:
        logger.warning("the library's configs were tuned at %s thread(s); running at %d: "
                       "their speed-ups may not hold", tuned, requested)
    return requested


def compare_with_onnxruntime(data: bytes, feeds: dict[str, Any], outputs: dict[str, Any],
                             threads: int) -> dict[str, float]:
    import numpy as np

    from tuner_service.compiler.deploy.errors import DeployError

    try:
        import onnxruntime as ort
    except ImportError as e:
        raise DeployError("--check compares with onnxruntime: pip install onnxruntime") from e
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds),
                        strict=True))
    abs_err = max(float(np.max(np.abs(outputs[n] - expected[n]))) for n in expected)
    scale = max(float(np.max(np.abs(expected[n]))) for n in expected) or 1.0
    return {"max_abs_error": abs_err, "max_rel_error": abs_err / scale}
