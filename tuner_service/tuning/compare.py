"""Before/after: the model built with template defaults, with tuned configs, and onnxruntime.

The summary the quick start ends with; every number is measured in the same run, on the same
random inputs, and the tuned library's outputs are checked against onnxruntime's.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Comparison:
    default_ms: float
    tuned_ms: float
    onnxruntime_ms: float | None
    max_rel_error: float | None
    library: Path

    @property
    def speedup(self) -> float:
        return self.default_ms / self.tuned_ms if self.tuned_ms else 0.0

    def lines(self) -> list[str]:
        out = [f"default configs: {self.default_ms:8.2f} ms",
               f"tuned configs:   {self.tuned_ms:8.2f} ms  ({self.speedup:.2f}x)"]
        if self.onnxruntime_ms is not None:
            out.append(f"onnxruntime:     {self.onnxruntime_ms:8.2f} ms")
        if self.max_rel_error is not None:
            out.append(f"tuned outputs vs onnxruntime: max relative error "
                       f"{self.max_rel_error:.2g}")
        return out


def compare(model: bytes, configs: Path, output: Path, threads: int,
            iterations: int = 20, layout: str = "nchw") -> Comparison:
    """Build ``output/lib`` (tuned) and ``output/lib-default`` in ``layout`` (``auto``: each
    the faster of its two plans, ``deploy.layout_choice``); time both and onnxruntime."""
    from tuner_service.compiler.deploy.configs import ConfigBook, load_configs_file
    from tuner_service.compiler.deploy.layout_choice import build_with_layout

    os.environ.setdefault("OMP_NUM_THREADS", str(threads))  # before libgomp is loaded
    tuned_dir, default_dir = output / "lib", output / "lib-default"
    build_with_layout(model, load_configs_file(configs), tuned_dir, "llvm", threads,
                      layout=layout)
    quiet = logging.getLogger("tuner_service.compiler.deploy.library")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # "no tuned config" for every layer is the point here
    try:
        build_with_layout(model, ConfigBook(target="llvm"), default_dir, "llvm", threads,
                          layout=layout)
    finally:
        quiet.setLevel(level)
    default_ms, _, _ = _time_library(model, default_dir, threads, iterations)
    tuned_ms, feeds, outputs = _time_library(model, tuned_dir, threads, iterations)
    ort = _onnxruntime(model, feeds, outputs, threads, iterations)
    return Comparison(default_ms, tuned_ms, ort[0] if ort else None, ort[1] if ort else None,
                      tuned_dir)


def _time_library(model: bytes, library: Path, threads: int, iterations: int
                  ) -> tuple[float, dict[str, Any], dict[str, Any]]:
    from tuner_service.compiler.deploy.executor import ModelRunner
    from tuner_service.compiler.deploy.loader import KernelLibrary
    from tuner_service.compiler.deploy.timing import time_runs

    runner = ModelRunner(model, KernelLibrary(library), threads)
    feeds = runner.random_feeds(0)
    outputs = runner.run(feeds)
    stats = time_runs(lambda: runner.run(feeds), iterations)
    return stats["median_s"] * 1e3, feeds, outputs


def _onnxruntime(model: bytes, feeds: dict[str, Any], outputs: dict[str, Any], threads: int,
                 iterations: int) -> tuple[float, float] | None:
    import numpy as np

    from tuner_service.compiler.deploy.timing import time_runs

    try:
        import onnxruntime
    except ImportError:
        logger.warning("onnxruntime is not installed: no comparison with it")
        return None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    expected = dict(zip(names, session.run(None, feeds), strict=True))
    stats = time_runs(lambda: session.run(None, feeds), iterations)
    error = max(float(np.max(np.abs(outputs[n] - expected[n]))) for n in names)
    scale = max(float(np.max(np.abs(expected[n]))) for n in names) or 1.0
    return stats["median_s"] * 1e3, error / scale
