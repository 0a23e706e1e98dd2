"""One peer latency measurement of a zoo model, in a fresh process (so each runtime gets exactly
the requested threads and no other runtime's idle pool spins beside it).

    python bench/zoo_peer.py ENGINE MODEL.onnx THREADS ITERATIONS
ENGINE: onnxruntime, openvino, or openvino-bf16 (OpenVINO asked to infer in bfloat16, the peer
of ``tuner build --precision bf16``). Prints one JSON object (latency statistics, or an error).
Inputs are seeded: floats standard normal, integers in {0, 1}, as ``tuner run`` makes them.
"""

from __future__ import annotations

import os
import sys

THREADS = sys.argv[3] if len(sys.argv) > 3 else "1"
os.environ["OMP_NUM_THREADS"] = THREADS
os.environ["OPENBLAS_NUM_THREADS"] = "1"

import json  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from tuner_service.compiler.deploy.timing import time_runs  # noqa: E402

#: onnxruntime's type strings -> numpy dtypes of the inputs the zoo has
_ORT_TYPES = {"tensor(float)": np.float32, "tensor(int64)": np.int64,
              "tensor(int32)": np.int32, "tensor(bool)": np.bool_}


def seeded_feeds(inputs: list[tuple[str, list[int], Any]]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for name, shape, dtype in inputs:
        if np.dtype(dtype).kind == "f":
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[name] = rng.integers(0, 2, shape).astype(dtype)
    return feeds


def onnxruntime_fn(path: Path, threads: int) -> Callable[[], Any]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = seeded_feeds([(i.name, list(i.shape), _ORT_TYPES[i.type])
                          for i in session.get_inputs()])
    return lambda: session.run(None, feeds)


def openvino_fn(path: Path, threads: int, precision: str = "f32") -> Callable[[], Any]:
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(path))
    # fp32 against fp32: on a CPU with AVX-512 BF16 (Zen 4 here) OpenVINO otherwise runs in bf16
    compiled = core.compile_model(model, "CPU", {
        "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
        "INFERENCE_PRECISION_HINT": precision})
    if compiled.get_property("INFERENCE_PRECISION_HINT") != getattr(ov.Type, precision):
        raise RuntimeError(f"OpenVINO does not infer in {precision} on this CPU")
    inputs = [(port.any_name, list(port.get_shape()), port.get_element_type().to_dtype())
              for port in compiled.inputs]
    feeds = seeded_feeds(inputs)
    request = compiled.create_infer_request()
    return lambda: request.infer(feeds)


def main() -> None:
    engine, path, threads = sys.argv[1], Path(sys.argv[2]), int(THREADS)
    iterations = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    try:
        fn = {"onnxruntime": onnxruntime_fn, "openvino": openvino_fn,
              "openvino-bf16": lambda p, t: openvino_fn(p, t, "bf16")}[engine](path, threads)
        stats = time_runs(fn, iterations, warmup=1)
    except ImportError as e:
        print(json.dumps({"error": f"{engine} is not installed ({e.name})"}))
        return
    except Exception as e:  # a peer that cannot run the model is a result, not a crash
        print(json.dumps({"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"[:300]
                          if str(e).strip() else type(e).__name__}))
        return
    print(json.dumps({"engine": engine, "threads": threads, **stats}))


if __name__ == "__main__":
    main()
