"""End-to-end latency of a callable model: warm-up runs, then a median and a p90."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np


def time_runs(run: Callable[[], Any], iterations: int, warmup: int = 3,
              min_seconds: float = 0.0) -> dict[str, float]:
    """Seconds per call over ``iterations`` calls (more while under ``min_seconds``)."""
    for _ in range(max(0, warmup)):
        run()
    samples: list[float] = []
    started = time.perf_counter()
    while len(samples) < max(1, iterations) or time.perf_counter() - started < min_seconds:
        t0 = time.perf_counter()
        run()
        samples.append(time.perf_counter() - t0)
    values = np.asarray(samples)
    return {
        "median_s": float(np.median(values)),
        "p90_s": float(np.percentile(values, 90)),
        "mean_s": float(values.mean()),
        "min_s": float(values.min()),
        "iterations": len(samples),
    }
