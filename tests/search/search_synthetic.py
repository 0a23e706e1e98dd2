"""A structured stand-in for measured GEMM throughput, for tests of the learned search.

Real lowered configs, a synthetic score: register-tile arithmetic intensity, a penalty when the
k-panel slice overflows a 32 KiB L1, vector lanes used, a bonus for unrolling the reduction.
Shaped like real GEMM behaviour, so features that describe the loop nest can learn it, and the
same rules hold for every shape (what transfer across workloads relies on).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from schedule_templates.records import ErrorKind, MeasureResult
from schedule_templates.space import ConfigSpace


def gemm_speed(space: ConfigSpace, index: int) -> float:
    cfg = space.get(index)
    _mo, _mi, mr = cfg["tile_m"]
    _no, _ni, nr = cfg["tile_n"]
    _ko, ki, ku = cfg["tile_k"]
    intensity = mr * nr / (mr + nr)
    panel_bytes = (mr + nr) * ki * ku * 4
    cache = 1.0 / (1.0 + max(0.0, panel_bytes / 32768 - 1.0))
    lanes = min(nr, 16) / 16
    order = 1.1 if cfg["outer_order"] == "nm" else 1.0
    return intensity * cache * lanes * order * (1.2 if ku > 1 else 1.0)


def inverted_speed(space: ConfigSpace, index: int) -> float:
    """A workload 'unlike any seen': what is fast for ``gemm_speed`` is slow here."""
    return 1.0 / (0.05 + gemm_speed(space, index))


def results(space: ConfigSpace, indices: Sequence[int], speed: object = gemm_speed,
            fail_every: int = 0) -> list[MeasureResult]:
    """Seconds = 1 / speed; every ``fail_every``-th config fails to compile."""
    out = []
    for n, index in enumerate(indices):
        if fail_every and n % fail_every == fail_every - 1:
            out.append(MeasureResult.failure(ErrorKind.COMPILE_HOST, "synthetic failure"))
        else:
            out.append(MeasureResult((1.0 / speed(space, index),)))  # type: ignore[operator]
    return out


def speeds(space: ConfigSpace, indices: Sequence[int]) -> np.ndarray:
    return np.array([gemm_speed(space, i) for i in indices])
