"""Plain (nchw) against blocked (nchwc) activations on whole models, with onnxruntime beside.

    python bench/layout_e2e.py MODEL [MODEL ...] [--rounds 7] [--runs 5] [--configs FILE]

MODEL is a sample name (``mobilenet_v2``, ``resnet18``) or an ONNX file (the zoo's are under
``bench/.zoo-cache/NAME-torchscript/model.onnx``). Both libraries are built with the same
configs (template defaults without ``--configs``), run at 1 thread on the same seeded inputs
with an onnxruntime session (1 intra-op thread), rounds interleaved, each timed in process CPU
time so that a loaded machine's descheduling does not land on one side. Prints JSON per model:
the median ms of each and the largest relative error against onnxruntime.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def _model_bytes(name: str) -> bytes:
    from tuner_service.compiler.frontend.samples import sample_model_bytes

    return Path(name).read_bytes() if name.endswith(".onnx") else sample_model_bytes(name)


def _median_ms(fn: Callable[[], Any], samples: list[float], runs: int) -> None:
    start = time.process_time()
    for _ in range(runs):
        fn()
    samples.append((time.process_time() - start) / runs * 1e3)


def measure(name: str, rounds: int, runs: int, configs: Path | None) -> dict[str, Any]:
    import onnxruntime as ort

    from tuner_service.compiler.deploy.configs import ConfigBook, load_configs_file
    from tuner_service.compiler.deploy.executor import ModelRunner
    from tuner_service.compiler.deploy.library import build_library
    from tuner_service.compiler.deploy.loader import KernelLibrary

    data = _model_bytes(name)
    book = load_configs_file(configs) if configs else ConfigBook(target="llvm")
    runners = {}
    with tempfile.TemporaryDirectory(prefix="layout-e2e-") as tmp:
        for layout in ("nchw", "nchwc"):
            out = Path(tmp) / layout
            build_library(data, book, out, "llvm", 1, layout=layout)
            runners[layout] = ModelRunner(data, KernelLibrary(out), threads=1)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    feeds = runners["nchw"].random_feeds(0)
    reference = session.run(None, feeds)
    result: dict[str, Any] = {"model": name}
    for layout, runner in runners.items():
        outputs = list(runner.run(feeds).values())
        result[f"{layout}_rel_err"] = max(
            float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-12))
            for a, b in zip(outputs, reference, strict=True))
    samples: dict[str, list[float]] = {k: [] for k in (*runners, "onnxruntime")}
    for _ in range(rounds):
        for layout, runner in runners.items():
            _median_ms(lambda r=runner: r.run(feeds), samples[layout], runs)  # type: ignore[misc]
        _median_ms(lambda: session.run(None, feeds), samples["onnxruntime"], runs)
    for key, values in samples.items():
        result[f"{key}_ms"] = round(float(np.median(values)), 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--configs", type=Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    for name in args.models:
        print(json.dumps(measure(name, args.rounds, args.runs, args.configs)), flush=True)


if __name__ == "__main__":
    main()
