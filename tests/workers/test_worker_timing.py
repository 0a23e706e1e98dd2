"""The run protocol: warm-up, ``number`` growing to ``min_repeat_ms``, ``repeat`` samples."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedule_templates.records import MeasureOptions
from workers.backends.timing import MAX_GROWTH, grow_number, time_protocol


class FakeKernel:
    """Each run advances a fake clock by ``cost`` seconds; counts the runs."""

    def __init__(self, cost: float) -> None:
        self.cost = cost
        self.now = 0.0
        self.runs = 0

    def run(self) -> None:
        self.runs += 1
        self.now += self.cost

    def clock(self) -> float:
        return self.now


def test_number_grows_until_a_sample_lasts_min_repeat_ms() -> None:
    kernel = FakeKernel(cost=1e-4)
    options = MeasureOptions(number=1, repeat=3, min_repeat_ms=10.0)
    costs = time_protocol(kernel.run, options, clock=kernel.clock)
    assert costs == pytest.approx([1e-4] * 3)
    # 1 warm-up, short samples of growing size, then 3 samples of >= 100 runs each.
    final_number = (kernel.runs - 1) // 3
    assert final_number * 1e-4 >= 10e-3 * 0.999
    assert kernel.runs < 1 + 3 * 100 * 1.5 + 200


def test_a_slow_kernel_keeps_number_and_gives_repeat_samples() -> None:
    kernel = FakeKernel(cost=0.05)
    costs = time_protocol(kernel.run, MeasureOptions(number=1, repeat=4, min_repeat_ms=10.0),
                          clock=kernel.clock)
    assert costs == pytest.approx([0.05] * 4)
    assert kernel.runs == 1 + 4  # warm-up plus one run per sample


def test_number_is_a_lower_bound() -> None:
    kernel = FakeKernel(cost=0.01)
    time_protocol(kernel.run, MeasureOptions(number=5, repeat=2, min_repeat_ms=0.0),
                  clock=kernel.clock)
    assert kernel.runs == 1 + 2 * 5


def test_cache_flush_is_excluded_from_the_timing() -> None:
    kernel = FakeKernel(cost=0.002)
    options = MeasureOptions(number=3, repeat=2, min_repeat_ms=0.0, flush_cache=True)
    costs = time_protocol(kernel.run, options, flush_bytes=1 << 16, clock=kernel.clock)
    assert costs == pytest.approx([0.002, 0.002])


def test_real_clock_measures_something() -> None:
    def work() -> None:
        sum(range(1000))

    costs = time_protocol(work, MeasureOptions(repeat=2, min_repeat_ms=2.0))
    assert len(costs) == 2 and all(c > 0 for c in costs)


@given(number=st.integers(1, 10**6), elapsed=st.floats(0.0, 1.0), min_s=st.floats(1e-6, 1.0))
def test_grow_number_always_grows_and_is_bounded(number: int, elapsed: float, min_s: float
                                                 ) -> None:
    grown = grow_number(number, elapsed, min_s)
    assert number < grown <= number * MAX_GROWTH
