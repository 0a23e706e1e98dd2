"""One end-to-end latency measurement in a fresh process (so that each runtime gets exactly the
requested threads and no other runtime's idle thread pool spins beside it).

    python bench/e2e_run.py ENGINE MODEL THREADS ITERATIONS [LIBRARY_DIR]
ENGINE: ours (needs LIBRARY_DIR), onnxruntime or torch. Prints one JSON object: latency
statistics and the max abs difference of the output from onnxruntime's.
"""

from __future__ import annotations

import os
import sys

THREADS = sys.argv[3] if len(sys.argv) > 3 else "1"
os.environ["OMP_NUM_THREADS"] = THREADS
os.environ["OPENBLAS_NUM_THREADS"] = "1"  # numpy only runs the cheap operators here

import json  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tuner_service.deploy.timing import time_runs  # noqa: E402
from tuner_service.frontend.samples import build_sample_model  # noqa: E402

MIN_SECONDS = 2.0  # keep sampling this long at least: the machine is shared


def onnxruntime_fn(model: Any, feed: np.ndarray, threads: int) -> Callable[[], np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda: session.run(None, {name: feed})[0]


def ours_fn(model: Any, feed: np.ndarray, threads: int, library: Path
            ) -> Callable[[], np.ndarray]:
    from tuner_service.deploy.executor import ModelRunner
    from tuner_service.deploy.loader import KernelLibrary

    runner = ModelRunner(model, KernelLibrary(library), threads)
    name, output = next(iter(runner.inputs)), runner.outputs[0]
    return lambda: runner.run({name: feed})[output]


def torch_fn(model: Any, feed: np.ndarray, threads: int) -> Callable[[], np.ndarray]:
    import torch
    from e2e_torch import torch_program

    torch.set_num_threads(threads)
    program = torch_program(model)
    x = torch.from_numpy(feed)

    def run() -> np.ndarray:
        with torch.inference_mode():
            return np.asarray(program(x).numpy())
    return run


def main() -> None:
    engine, name, threads = sys.argv[1], sys.argv[2], int(THREADS)
    iterations = int(sys.argv[4]) if len(sys.argv) > 4 else 30
    model = build_sample_model(name)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    feed = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    if engine == "ours":
        fn = ours_fn(model, feed, threads, Path(sys.argv[5]))
    elif engine == "onnxruntime":
        fn = onnxruntime_fn(model, feed, threads)
    elif engine == "torch":
        fn = torch_fn(model, feed, threads)
    else:
        raise SystemExit(f"unknown engine {engine}")
    got = fn()
    reference = got if engine == "onnxruntime" else onnxruntime_fn(model, feed, 1)()
    stats = time_runs(fn, iterations, warmup=5, min_seconds=MIN_SECONDS)
    print(json.dumps({**stats, "max_abs_diff_vs_onnxruntime": float(np.max(np.abs(
        got - reference)))}))


if __name__ == "__main__":
    main()
