"""Latency of several engines on one model, in one process, one run of each in turn: ratios
that hold on a machine whose speed changes under it.

    python bench/paired.py MODEL.onnx ENGINE [ENGINE ...] [--threads 1] [--rounds 40]

An ENGINE is a library directory of ``tuner build`` (``DIR@T`` runs it at T threads instead),
``onnxruntime``, ``openvino`` (fp32) or ``openvino-bf16``, as ``bench/zoo_peer.py`` makes
them. After a warm-up,
each round runs every engine once, in the order given rotated by one a round (so each engine
follows each other as often); each run is paired with the first
engine's run of the same round, so a change of the machine's speed between rounds (these VMs
switch between phases about 2x apart, within a process too) hits both sides of a ratio alike.
Prints JSON: per engine the median, 25th percentile and fastest run, and the median over rounds
of its time divided by the first engine's (below 1: faster than the first).

Several thread pools in one process compete for the cores: after its run onnxruntime's workers
spin (here they are told not to), and OpenVINO's and libgomp's wait a while before sleeping.
At one thread there is no pool; at more, pair libraries of ours with each other and time the
peers in fresh processes (``bench/zoo_peer.py``), or read the peers' ratios with that in mind.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    _THREADS = sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv else "1"
    os.environ["OMP_NUM_THREADS"] = _THREADS
    os.environ["OPENBLAS_NUM_THREADS"] = "1"

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tuner_service.errors import TunerServiceError
from workers.hardware import cpu_facts

PEERS = ("onnxruntime", "openvino", "openvino-bf16")


def engine_fn(engine: str, model: Path, threads: int) -> Callable[[], Any]:
    """One run of ``engine`` on ``model``'s seeded inputs."""
    if engine == "onnxruntime":
        import onnxruntime as ort
        from zoo_peer import _ORT_TYPES, seeded_feeds

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        feeds = seeded_feeds([(i.name, list(i.shape), _ORT_TYPES[i.type])
                              for i in session.get_inputs()])
        return lambda: session.run(None, feeds)
    if engine in ("openvino", "openvino-bf16"):
        from zoo_peer import openvino_fn

        return openvino_fn(model, threads, "bf16" if engine == "openvino-bf16" else "f32")
    from tuner_service.compiler.deploy.executor import ModelRunner
    from tuner_service.compiler.deploy.loader import KernelLibrary

    library, _, at = engine.partition("@")
    runner = ModelRunner(model.read_bytes(), KernelLibrary(Path(library)),
                         int(at) if at else threads)
    ours = runner.random_feeds(0)
    return lambda: runner.run(ours)


def paired(fns: list[Callable[[], Any]], rounds: int, warmup: int = 3) -> list[list[float]]:
    """Milliseconds of each function's run in each round, the functions run in turn, each
    round starting one further along the list: a run right after another engine's finds the
    caches holding that engine's data, so a fixed order charged the first engine for it (2-3%
    either way between two builds of int8 ResNet-50, AMX Xeon, session 22)."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for round_ in range(rounds):
        for turn in range(len(fns)):
            index = (round_ + turn) % len(fns)
            start = time.perf_counter()
            fns[index]()
            times[index].append((time.perf_counter() - start) * 1e3)
    return times


def summary(engines: list[str], times: list[list[float]]) -> list[dict[str, Any]]:
    first = times[0]
    return [{"engine": engine,
             "median_ms": round(statistics.median(column), 3),
             "p25_ms": round(float(np.percentile(column, 25)), 3),
             "min_ms": round(min(column), 3),
             "ratio_to_first": round(statistics.median(a / b for a, b in zip(column, first,
                                                                             strict=True)), 4)}
            for engine, column in zip(engines, times, strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("engines", nargs="+",
                        help="library directories (DIR or DIR@THREADS), onnxruntime, openvino, "
                             "openvino-bf16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.threads < 1:
        parser.error("--rounds and --threads must be positive")
    if not args.model.is_file():
        parser.error(f"no model file at {args.model}")
    for engine in args.engines:
        library = engine.partition("@")[0]
        if engine not in PEERS and not (Path(library) / "manifest.json").is_file():
            parser.error(f"{engine!r} is neither a peer ({', '.join(PEERS)}) nor a library "
                         "directory of `tuner build`")
    try:
        fns = [engine_fn(engine, args.model, args.threads) for engine in args.engines]
    except (TunerServiceError, ImportError, RuntimeError) as e:
        print(json.dumps({"error": f"{type(e).__name__}: {e}"[:400]}))
        return 1
    times = paired(fns, args.rounds)
    print(json.dumps({"model": str(args.model), "threads": args.threads, "rounds": args.rounds,
                      "cpu": cpu_facts().get("cpu_model"),
                      "load_average": [round(x, 2) for x in os.getloadavg()],
                      "engines": summary(args.engines, times)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
