"""PyTorch eager latency of one zoo model, in the exporter environment (.venv-zoo: PyPI's
torchvision needs the torch it was built against) and in a fresh process with exactly the
requested threads. The model is built as ``bench/zoo_export.py`` builds it for export (same
seed, same re-drawn weights, eval mode), then timed under ``torch.inference_mode``.

    .venv-zoo/bin/python bench/zoo_torch.py MODEL THREADS ITERATIONS
Prints one JSON object: latency statistics, or an error.
"""

from __future__ import annotations

import os
import sys

THREADS = sys.argv[2] if len(sys.argv) > 2 else "1"
os.environ["OMP_NUM_THREADS"] = THREADS

import importlib.util  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).resolve().parent
WARMUP = 2


def zoo_export() -> ModuleType:
    """bench/zoo_export.py, loaded by path: bench/ stays off the import path (see there)."""
    spec = importlib.util.spec_from_file_location("zoo_export", HERE / "zoo_export.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(run: Any, iterations: int) -> dict[str, float]:
    for _ in range(WARMUP):
        run()
    samples = []
    for _ in range(max(1, iterations)):
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    return {"median_s": statistics.median(samples), "min_s": min(samples),
            "iterations": len(samples)}


def main() -> None:
    name, threads = sys.argv[1], int(THREADS)
    iterations = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    exporter = zoo_export()
    import torch

    torch.manual_seed(exporter.SEED)
    torch.set_num_threads(threads)
    model, args, _ = exporter.build(name)
    exporter.randomize(model, torch.Generator().manual_seed(exporter.SEED))
    model.eval()

    def run() -> Any:
        with torch.inference_mode():
            return model(*args)

    print(json.dumps({"engine": "torch", "threads": threads, "torch": torch.__version__,
                      **timed(run, iterations)}))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a model torch cannot run is a result of the benchmark, not a crash
        print(json.dumps({"error": f"{type(e).__name__}: {str(e).strip()[:300]}"}))
