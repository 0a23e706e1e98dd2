"""The worker pipeline: builds beside timed runs (never on the timing cores), the compile cache
across candidates, the feed thread (prefetched claims, batched reports) and results' timings."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest

from schedule_templates.protocol import Candidate, ClaimItem, Target
from schedule_templates.records import ErrorKind, MeasureOptions
from tests.workers.conftest import StubServer, make_item
from workers.agent import run_worker
from workers.backends import BackendSpec
from workers.errors import ServerRejected
from workers.feed import Feed
from workers.measure.cores import CoreLayout
from workers.measure.pool import IsolatedMeasurer
from workers.settings import WorkerSettings
from workers.timings import STAGES

pytestmark = pytest.mark.timeout(180)

OPTIONS = MeasureOptions(repeat=1, min_repeat_ms=0.0, check_correctness=False,
                         build_timeout_s=20.0, run_timeout_s=20.0)
needs_two_cores = pytest.mark.skipif(not CoreLayout.of_this_process().overlaps(1),
                                     reason="builds beside a timed run need two usable cores")


def task(index: int, options: MeasureOptions = OPTIONS, **extra: Any) -> ClaimItem:
    return ClaimItem(index, Candidate("dense.x86", "dense:M=64,N=64,K=64", {"index": index}),
                     Target("llvm"), options, **extra)


@needs_two_cores
def test_builds_overlap_timed_runs_but_never_on_the_timing_core(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    spec = BackendSpec("fake", {"validate": False, "compile_s": 0.25, "run_s": 0.25,
                                "trace": str(trace)})
    with IsolatedMeasurer(spec, parallel_build=1, overlap=True) as m:
        assert m.overlap and m.processes == 2
        results = list(m.measure_many(task(i) for i in range(6)))
    assert len(results) == 6 and all(r.ok for _t, r in results)
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    timed = [e for e in events if e["phase"] == "time"]
    builds = [e for e in events if e["phase"] == "build"]
    assert len(timed) == 6
    overlapping = 0
    for run in timed:
        assert len(run["cpus"]) == 1  # a one-thread kernel is timed on one core
        beside = [b for b in builds if b["pid"] != run["pid"]
                  and run["start"] <= b["at"] <= run["end"]]
        overlapping += len(beside)
        assert all(set(b["cpus"]).isdisjoint(run["cpus"]) for b in beside), (run, beside)
    assert overlapping > 0  # something was built while a kernel was timed


@needs_two_cores
def test_a_kernel_on_every_core_is_timed_with_nothing_building(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    cores = len(CoreLayout.of_this_process().cores)
    spec = BackendSpec("fake", {"validate": False, "compile_s": 0.2, "run_s": 0.2,
                                "trace": str(trace)})
    with IsolatedMeasurer(spec, parallel_build=1, overlap=True) as m:
        results = list(m.measure_many(task(i, threads=cores) for i in range(4)))
    assert all(r.ok for _t, r in results)
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    for run in (e for e in events if e["phase"] == "time"):
        assert not [b for b in events if b["phase"] == "build"
                    and run["start"] <= b["at"] <= run["end"]]


def test_a_slow_child_start_is_not_counted_as_build_time() -> None:
    """The build timeout counts from the child's "compiling" message: a fresh child that takes
    longer to start than a short build timeout (a loaded machine) still measures its task,
    while a build that hangs in a started child is still cut at the timeout."""
    options = dataclasses.replace(OPTIONS, build_timeout_s=0.5, run_timeout_s=0.5)
    spec = BackendSpec("fake", {"validate": False, "start_s": 1.5, "faults": {"1": "hang_build"}})
    with IsolatedMeasurer(spec, parallel_build=1) as m:
        results = {t.candidate.config["index"]: r
                   for t, r in m.measure_many(task(i, options) for i in range(2))}
    assert results[0].ok, results[0].error_message
    assert not results[1].ok and results[1].error is ErrorKind.BUILD_TIMEOUT


def test_a_config_measured_again_is_loaded_from_the_compile_cache() -> None:
    pytest.importorskip("llvmlite")
    from schedule_templates.templates.base import template_by_name
    from schedule_templates.workloads import parse_workload

    workload = "dense:M=64,N=64,K=64"
    index = template_by_name("dense.x86").default_config(parse_workload(workload)).index
    options = MeasureOptions(repeat=2, min_repeat_ms=0.0)
    tasks = [task(index, options), dataclasses.replace(task(index, options), measure_id=2)]
    with IsolatedMeasurer(BackendSpec("llvm"), parallel_build=1) as m:
        measured = list(m.measure_stream(lambda: tasks.pop(0) if tasks else None))
        assert (m.cache.hits, m.cache.misses, len(m.cache)) == (1, 1, 1)
    first, again = (x.result for x in measured)
    assert first.ok and again.ok, (first, again)
    assert measured[1].times.build_s < measured[0].times.build_s


class _Calls:
    """A claim and a report for the feed, counting what they were asked."""

    def __init__(self, items: int) -> None:
        self.left = items
        self.claims: list[int] = []
        self.reports = 0
        self.spooled = 0
        self.refuse = False

    def claim(self, wait_s: float, max_items: int) -> list[ClaimItem]:
        if self.refuse:
            raise ServerRejected(401, "bad token")
        n = min(max_items, self.left)
        self.claims.append(max_items)
        self.left -= n
        return [task(self.left + i) for i in range(n)]

    def report(self) -> bool:
        self.reports += 1
        self.spooled = 0
        return True


def test_the_feed_keeps_its_depth_and_reports_in_batches() -> None:
    calls = _Calls(items=10)
    feed = Feed(calls.claim, calls.report, lambda: calls.spooled, depth=3, poll_s=0.05,
                report_batch=4, report_interval_s=60.0)
    with feed:
        assert feed.wait_for_work(5.0)
        time.sleep(0.2)
        assert max(calls.claims) <= 3 and calls.left == 7  # only the depth is claimed
        taken = [feed.next_task() for _ in range(3)]
        assert all(t is not None for t in taken)
        for _ in range(3):
            calls.spooled += 1
            feed.result_added()
        time.sleep(0.2)
        assert calls.reports == 0  # 3 results < a batch of 4, well within the interval
        calls.spooled += 1
        feed.result_added()
        deadline = time.monotonic() + 5
        while calls.reports == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert calls.reports == 1
        claimed = feed.claim_of(taken[0].measure_id)  # type: ignore[union-attr]
        assert claimed is not None and claimed.claim_s >= 0
    assert feed.unstarted() == [] or calls.left < 7


def test_a_refused_claim_stops_the_feed_with_its_error() -> None:
    calls = _Calls(items=0)
    calls.refuse = True
    with Feed(calls.claim, calls.report, lambda: 0, depth=2, poll_s=0.05) as feed:
        assert not feed.wait_for_work(5.0)
    assert isinstance(feed.error, ServerRejected)


def test_results_carry_their_time_split(stub_server: StubServer, tmp_path: Path) -> None:
    stub_server.queue += [make_item(i) for i in range(8)]
    options = {"validate": False, "compile_s": 0.05, "run_s": 0.05}
    settings = WorkerSettings(server=stub_server.url, token="secret", device_key="test-cpu",
                              backend="fake", backend_options=options,
                              spool_dir=tmp_path / "spool", max_idle_s=0.5, poll_s=0.1,
                              report_interval_s=1.0)
    assert run_worker(settings) == 0
    assert sorted(stub_server.results) == list(range(8))
    assert stub_server.reports < 8  # in batches, not one request per result
    for result in stub_server.results.values():
        timings = result["timings"]
        assert list(timings) == list(STAGES) and all(v >= 0 for v in timings.values())
        assert timings["build_s"] >= 0.04 and timings["claim_s"] > 0
        assert "finished_at" not in result
    assert max(r["timings"]["report_s"] for r in stub_server.results.values()) > 0


def test_builds_stay_off_the_timing_cores_and_their_smt_siblings(tmp_path: Path) -> None:
    from workers.measure.cores import parse_cpu_list, read_siblings

    assert parse_cpu_list("0-2,8\n") == {0, 1, 2, 8}
    (tmp_path / "cpu0" / "topology").mkdir(parents=True)
    (tmp_path / "cpu0" / "topology" / "thread_siblings_list").write_text("0,2\n")
    assert read_siblings(0, tmp_path) == {0, 2} and read_siblings(1, tmp_path) == {1}
    smt = CoreLayout((0, 1, 2, 3), (frozenset({0, 2}), frozenset({1, 3}),
                                    frozenset({0, 2}), frozenset({1, 3})))
    assert smt.timing(1) == {0} and smt.building(1) == {1, 3}
    assert smt.building(2) == set()
    one_core_two_threads = CoreLayout((0, 1), (frozenset({0, 1}), frozenset({0, 1})))
    assert one_core_two_threads.building(1) == set()
    assert CoreLayout((0, 1)).building(1) == {1} and CoreLayout((0, 1)).building(2) == set()


def test_a_bug_in_the_feed_stops_it_with_an_error_instead_of_starving_the_worker() -> None:
    def broken(wait_s: float, max_items: int) -> list[ClaimItem]:
        raise KeyError("a bug")

    with Feed(broken, lambda: True, lambda: 0, depth=1, poll_s=0.05) as feed:
        assert not feed.wait_for_work(5.0)
    assert feed.error is not None and "KeyError" in str(feed.error)


def test_a_failing_report_is_retried_with_backoff_not_in_a_tight_loop() -> None:
    from workers.errors import ServerUnavailable

    attempts: list[float] = []

    def report() -> bool:
        attempts.append(time.monotonic())
        raise ServerUnavailable("down")

    with Feed(lambda wait_s, n: [], report, lambda: 100, depth=1, poll_s=0.05,
              report_batch=4, report_interval_s=0.0) as feed:
        time.sleep(1.2)
    assert feed.error is None and 1 <= len(attempts) <= 4
