"""Measurement hygiene: the load of other processes and frequency drift around a timed run;
noisy runs are measured again or flagged, and every result carries its spread."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from schedule_templates.records import MeasureOptions, MeasureResult
from schedule_templates.templates.base import get_template
from schedule_templates.workloads import parse_workload
from workers.measure.hygiene import (
    MAX_OTHER_LOAD,
    QuietGauge,
    Quietness,
    other_load,
    parse_snapshot,
)

SELF = "42 (python3 -c x) R 1 1 1 0 -1 0 0 0 0 0 {utime} {stime} 0 0 20 0 1 0"
STAT = "cpu  1 2 3 4\ncpu0 {busy0} 0 0 {idle0} 0 0 0 0\ncpu1 {busy1} 0 0 {idle1} 0 0 0 0\n"


def snapshot(busy0: int, busy1: int, idle: int, own: int, cpus: set[int]) -> object:
    stat = STAT.format(busy0=busy0, busy1=busy1, idle0=idle, idle1=idle)
    return parse_snapshot(stat, SELF.format(utime=own, stime=0), cpus)


def test_load_of_other_processes_from_proc_counters() -> None:
    tick = os.sysconf("SC_CLK_TCK")
    # one second: the cores were busy 1.5 s in all, 0.5 s of it this process's own
    start = snapshot(100, 100, 500, 7, {0, 1})
    end = snapshot(100 + tick, 100 + tick // 2, 500 + tick // 2, 7 + tick // 2, {0, 1})
    assert other_load(start, end, 1.0) == pytest.approx(1.0, abs=0.02)
    # only the measurement cores count: core 1 is someone else's business
    assert other_load(snapshot(100, 100, 500, 0, {0}), snapshot(100, 100 + tick, 500, 0, {0}),
                      1.0) == 0.0
    assert other_load(start, end, 0.01) is None  # too short to tell
    assert other_load(None, end, 1.0) is None


def test_a_noisy_run_is_measured_again_and_the_quietest_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen = iter([Quietness(1.0, 0.0), Quietness(0.05, 0.0)])
    runs = iter([(3e-3, 1e-3), (1e-3, 1e-3)])
    gauge = QuietGauge(retries=2)
    monkeypatch.setattr(gauge, "probe", lambda run: (next(runs), next(seen)))
    monkeypatch.setattr("workers.measure.hygiene.RETRY_PAUSE_S", 0.0)
    costs, quiet, attempts = gauge.measure(lambda: ())
    assert attempts == 2 and costs == (1e-3, 1e-3) and quiet.quiet


def test_persistent_load_is_flagged_without_endless_retries(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gauge = QuietGauge(retries=2)
    calls: list[int] = []

    def busy(run: object) -> tuple[tuple[float, ...], Quietness]:
        calls.append(1)
        return (1e-3,), Quietness(1.0 + len(calls), 0.3)

    monkeypatch.setattr(gauge, "probe", busy)
    monkeypatch.setattr("workers.measure.hygiene.RETRY_PAUSE_S", 0.0)
    _costs, first, attempts = gauge.measure(lambda: ())
    assert attempts == 3 and not first.quiet and first.other_load == 2.0  # the quietest
    _costs, second, attempts = gauge.measure(lambda: ())
    assert attempts == 1 and not second.quiet  # still busy: flagged, not measured again


def test_drift_against_the_recent_reference_loops() -> None:
    gauge = QuietGauge(retries=0, proc=Path("/nonexistent"))
    gauge.reference_s()
    costs, seen = gauge.probe(lambda: (1e-3,))
    assert costs == (1e-3,) and seen.other_load is None and seen.drift >= 0.0


def test_results_carry_spread_and_noise_over_the_wire() -> None:
    result = MeasureResult(costs=(1.0e-3, 1.1e-3, 1.2e-3), noisy=True, load=1.25)
    assert result.spread == pytest.approx(0.2)
    again = MeasureResult.from_json(result.to_json())
    assert again.noisy and again.load == 1.25 and again.spread == pytest.approx(0.2)
    assert MeasureResult.from_json({"costs": [1.0], "load": float("nan")}).load is None
    assert MeasureResult(costs=(1.0,)).spread == 0.0


def _spin(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


@pytest.fixture
def busy_child() -> Iterator[None]:
    """A busy loop in another process on this process's cores (an injected load)."""
    child = multiprocessing.get_context("spawn").Process(
        target=_spin, args=(time.monotonic() + 120,), daemon=True)
    child.start()
    time.sleep(0.5)  # let it start spinning
    try:
        yield
    finally:
        child.kill()
        child.join(10)


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the load probe reads /proc")
def test_an_injected_load_marks_a_real_measurement_noisy(busy_child: None) -> None:
    from workers.measure import measure_candidate

    workload = parse_workload("dense:M=64,N=64,K=64")
    config = get_template("dense", "llvm").default_config(workload).to_json()
    options = MeasureOptions(number=1, repeat=3, min_repeat_ms=60.0)
    result = measure_candidate(workload.key, "dense.x86", config, "llvm", options, threads=1)
    assert result.ok, result.error_message
    # the busy loop holds about one core for the whole run (on a shared machine, more)
    assert result.load is not None and result.load > MAX_OTHER_LOAD
    assert result.noisy
    assert result.spread >= 0.0


@pytest.mark.parametrize(("before", "after", "quiet"), [
    (1.3e-3, 1.3e-3, False),  # both probes slow: the core itself ran slower
    (1.3e-3, 1.0e-3, True),  # one slow probe: a passing blip, not the timed run's core
    (1.0e-3, 1.05e-3, True),
])
def test_drift_is_the_quicker_probe_against_the_recent_median(
        monkeypatch: pytest.MonkeyPatch, before: float, after: float, quiet: bool) -> None:
    gauge = QuietGauge(retries=0, proc=Path("/nonexistent"))
    for _ in range(8):
        gauge._references.append(1.0e-3)
    probes = iter((before, after))
    monkeypatch.setattr(gauge, "reference_s", lambda: next(probes))
    _costs, seen = gauge.probe(lambda: (1e-3,))
    assert seen.quiet is quiet
    assert seen.drift == pytest.approx(min(before, after) / 1.0e-3 - 1.0)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity")
                    or not {0, 1} <= os.sched_getaffinity(0),
                    reason="needs cores 0 and 1 (those of the fake /proc/stat) to pin to one")
def test_the_load_probe_watches_the_cores_the_process_has_when_it_probes(tmp_path: Path
                                                                         ) -> None:
    # A timed child is pinned to the timing core just before its run: builds on the other
    # cores must not count as load on it.
    from workers.measure.cores import pinned

    (tmp_path / "self").mkdir()
    (tmp_path / "stat").write_text(STAT.format(busy0=500, busy1=900, idle0=10, idle1=10))
    (tmp_path / "self" / "stat").write_text(SELF.format(utime=0, stime=0))
    gauge = QuietGauge(proc=tmp_path)
    first = 0
    with pinned(frozenset({first})):
        seen = gauge.snapshot()
    assert seen is not None and seen == parse_snapshot(
        (tmp_path / "stat").read_text(), SELF.format(utime=0, stime=0), {first})
    assert gauge.snapshot() == parse_snapshot((tmp_path / "stat").read_text(),
                                              SELF.format(utime=0, stime=0),
                                              set(os.sched_getaffinity(0)))
