"""PyTorch eager latency of one sample model, in a fresh process (so torch gets exactly the
requested threads and no other runtime's idle pool spins beside it). The zoo's PyTorch column
comes from ``bench/zoo_torch.py`` in the exporter environment instead.

    python bench/e2e_run.py MODEL THREADS ITERATIONS
Prints one JSON object: latency statistics and the max abs difference of the eager program's
output from onnxruntime's (a check that it is the same model).
"""

from __future__ import annotations

import os
import sys

THREADS = sys.argv[2] if len(sys.argv) > 2 else "1"
os.environ["OMP_NUM_THREADS"] = THREADS
os.environ["OPENBLAS_NUM_THREADS"] = "1"

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tuner_service.compiler.deploy.timing import time_runs  # noqa: E402
from tuner_service.compiler.frontend.samples import build_sample_model  # noqa: E402

MIN_SECONDS = 1.0  # keep sampling this long at least: the machine may be shared


def onnxruntime_output(model: onnx.ModelProto, feed: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {session.get_inputs()[0].name: feed})[0])


def main() -> None:
    import torch
    from e2e_torch import torch_program

    name, threads = sys.argv[1], int(THREADS)
    iterations = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    model = build_sample_model(name)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    feed = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    reference = onnxruntime_output(model, feed)  # one thread: its pool does not linger
    torch.set_num_threads(threads)
    program = torch_program(model)
    x = torch.from_numpy(feed)

    def run() -> np.ndarray:
        with torch.inference_mode():
            return np.asarray(program(x).numpy())

    got = run()
    stats = time_runs(run, iterations, warmup=3, min_seconds=MIN_SECONDS)
    print(json.dumps({"engine": "torch", "threads": threads, **stats,
                      "max_abs_diff_vs_onnxruntime": float(np.max(np.abs(got - reference)))}))


if __name__ == "__main__":
    main()
