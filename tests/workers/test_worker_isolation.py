"""Process isolation: crashes, hangs and wrong answers become error kinds; the measurer lives on.

The faults come from the fake backend, so these tests need no compiler and no template.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator

import pytest

from schedule_templates.protocol import Candidate, ClaimItem, Target
from schedule_templates.records import ErrorKind, MeasureOptions
from workers.backends import BackendSpec
from workers.errors import BackendError
from workers.measure.pool import IsolatedMeasurer, describe_exit

# build_timeout_s covers starting a fresh child after a crash: seconds on a loaded machine
OPTIONS = MeasureOptions(repeat=2, min_repeat_ms=0.0, build_timeout_s=4.0, run_timeout_s=1.5)
FAULTS = {1: "segfault", 2: "exit", 3: "hang_build", 4: "hang_run", 5: "wrong",
          6: "compile_error", 7: "invalid", 8: "runtime_error"}
EXPECTED = {
    1: (ErrorKind.RUNTIME, "SIGSEGV"),
    2: (ErrorKind.RUNTIME, "exited with status 3"),
    3: (ErrorKind.BUILD_TIMEOUT, "timeout"),
    4: (ErrorKind.RUN_TIMEOUT, "timeout"),
    5: (ErrorKind.WRONG_ANSWER, "max abs error"),
    6: (ErrorKind.COMPILE_HOST, "does not compile"),
    7: (ErrorKind.INSTANTIATION, "invalid"),
    8: (ErrorKind.RUNTIME, "FakeKernelError"),
}

pytestmark = pytest.mark.timeout(120)


def task(index: int, options: MeasureOptions = OPTIONS) -> ClaimItem:
    return ClaimItem(index, Candidate("dense.x86", "dense:M=64,N=64,K=64", {"index": index}),
                     Target("llvm"), options)


@pytest.fixture(scope="module")
def measurer() -> Iterator[IsolatedMeasurer]:
    spec = BackendSpec("fake", {"validate": False, "faults": FAULTS})
    with IsolatedMeasurer(spec, parallel_build=2, max_tasks_per_child=50) as m:
        yield m


@pytest.mark.parametrize("index", sorted(FAULTS))
def test_each_fault_gives_its_kind_and_the_measurer_keeps_working(
        measurer: IsolatedMeasurer, index: int) -> None:
    kind, words = EXPECTED[index]
    result = measurer.measure(task(index))
    assert result.error is kind, result
    assert words in result.error_message
    assert result.costs == ()
    after = measurer.measure(task(100 + index))
    assert after.ok and len(after.costs) == OPTIONS.repeat


def test_a_batch_mixing_faults_gives_every_result(measurer: IsolatedMeasurer) -> None:
    tasks = [task(i) for i in (0, 1, 5, 9, 6, 2, 10)]
    results = dict((t.measure_id, r) for t, r in measurer.measure_many(tasks))
    assert set(results) == {0, 1, 5, 9, 6, 2, 10}
    assert [results[i].ok for i in (0, 9, 10)] == [True, True, True]
    assert results[1].error is ErrorKind.RUNTIME and results[5].error is ErrorKind.WRONG_ANSWER


def test_costs_are_deterministic_per_config(measurer: IsolatedMeasurer) -> None:
    first, second = measurer.measure(task(42)), measurer.measure(task(42))
    assert first.ok and first.costs == second.costs
    assert measurer.measure(task(43)).costs != first.costs


def test_children_are_recycled_and_nothing_leaks() -> None:
    before = set(multiprocessing.active_children())
    spec = BackendSpec("fake", {"validate": False})
    with IsolatedMeasurer(spec, parallel_build=2, max_tasks_per_child=3) as m:
        results = list(m.measure_many(task(i) for i in range(20)))
        assert len(results) == 20 and all(r.ok for _t, r in results)
        assert 7 <= m.children_started <= 10
        assert len(set(multiprocessing.active_children()) - before) <= 2
    assert set(multiprocessing.active_children()) <= before


def test_a_backend_left_unusable_gets_a_fresh_child() -> None:
    spec = BackendSpec("fake", {"validate": False, "faults": {2: "poison"}})
    with IsolatedMeasurer(spec, parallel_build=1) as m:
        results = {t.measure_id: r for t, r in m.measure_many(task(i) for i in range(5))}
        assert results[2].error is ErrorKind.RUNTIME and "poison" in results[2].error_message
        assert all(results[i].ok for i in (0, 1, 3, 4))
        assert m.children_started == 2  # replaced once, after the poisoning candidate


def test_timed_runs_never_overlap_compiles_or_each_other() -> None:
    # Compiles (0.3 s) may overlap each other, timed runs (0.3 s) may overlap nothing: 4 tasks
    # on 2 slots take at least 2 build rounds + 4 timings = 6 x 0.3 s. Fully parallel would be
    # about 4 x 0.3 s.
    spec = BackendSpec("fake", {"validate": False, "compile_s": 0.3, "run_s": 0.3})
    options = MeasureOptions(repeat=1, min_repeat_ms=0.0, check_correctness=False)
    with IsolatedMeasurer(spec, parallel_build=2) as m:
        m.measure(task(0, options))  # start the children
        start = time.monotonic()
        results = list(m.measure_many(task(i, options) for i in range(1, 5)))
        elapsed = time.monotonic() - start
    assert all(r.ok for _t, r in results)
    assert elapsed >= 6 * 0.3 - 0.05


def test_stop_leaves_unstarted_tasks() -> None:
    spec = BackendSpec("fake", {"validate": False})
    with IsolatedMeasurer(spec, parallel_build=1) as m:
        assert list(m.measure_many([task(0)], should_stop=lambda: True)) == []
        done: list[object] = []
        for t, _r in m.measure_many([task(i) for i in range(5)], should_stop=lambda: bool(done)):
            done.append(t.measure_id)
    assert done == [0]


def test_a_bad_backend_spec_fails_at_construction() -> None:
    with pytest.raises(BackendError):
        IsolatedMeasurer(BackendSpec("nope"))
    with pytest.raises(BackendError):
        IsolatedMeasurer(BackendSpec("fake", {"colour": "blue"}))


def test_describe_exit() -> None:
    assert describe_exit(-11) == "was killed by SIGSEGV"
    assert describe_exit(3) == "exited with status 3"
