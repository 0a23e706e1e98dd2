"""The run protocol: one warm-up, then ``repeat`` samples, each the mean of ``number`` runs;
``number`` grows until one sample lasts at least ``min_repeat_ms``.

With ``flush_bytes`` every run is preceded by writing a buffer larger than the last-level cache;
the flush is outside the timed region, so each run is timed on its own and the times summed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from schedule_templates.records import MeasureOptions

Clock = Callable[[], float]

#: growth of ``number`` per short sample is bounded, so one noisy fast sample cannot make the
#: next one take minutes
MAX_GROWTH = 100
#: aim a little above ``min_repeat_ms`` so that jitter does not cause another round
HEADROOM = 1.2


def time_protocol(
    run: Callable[[], None],
    options: MeasureOptions,
    flush_bytes: int = 0,
    clock: Clock = time.perf_counter,
) -> tuple[float, ...]:
    """Seconds of one run, one entry per sample (``options.repeat`` of them)."""
    flush = _make_flush(flush_bytes)
    if flush is not None:
        flush()
    run()  # warm-up: first-touch page faults, instruction cache, lazy binding
    number = max(1, options.number)
    min_s = max(0.0, options.min_repeat_ms) / 1000.0
    costs: list[float] = []
    while len(costs) < max(1, options.repeat):
        elapsed = _sample(run, number, flush, clock)
        if elapsed < min_s and not costs:
            number = grow_number(number, elapsed, min_s)
            continue
        costs.append(elapsed / number)
    return tuple(costs)


def grow_number(number: int, elapsed: float, min_s: float) -> int:
    """The next ``number`` after a sample of ``number`` runs took ``elapsed`` < ``min_s``."""
    if elapsed <= 0.0:
        return number * MAX_GROWTH
    factor = min(float(MAX_GROWTH), min_s * HEADROOM / elapsed)
    return max(number + 1, min(math.ceil(number * factor), number * MAX_GROWTH))


def _sample(
    run: Callable[[], None], number: int, flush: Callable[[], None] | None, clock: Clock
) -> float:
    if flush is None:
        start = clock()
        for _ in range(number):
            run()
        return clock() - start
    total = 0.0
    for _ in range(number):
        flush()
        start = clock()
        run()
        total += clock() - start
    return total


def _make_flush(flush_bytes: int) -> Callable[[], None] | None:
    if flush_bytes <= 0:
        return None
    buffer = np.zeros(max(1, flush_bytes // 8), dtype=np.float64)
    counter = [0.0]

    def flush() -> None:
        # A different value each time so that the writes cannot be skipped; writing (not just
        # reading) also evicts dirty lines of the kernel's output.
        counter[0] += 1.0
        buffer.fill(counter[0])

    return flush
