"""Process isolation: each candidate is measured in a child process with timeouts.

Timing exclusivity is decided by the parent, not by a lock the children share. A child tells
the parent its phase (compile, verify, time) and, before timing, waits for the parent's "go".
Timed runs never overlap each other. Without ``overlap``, the parent grants "go" only when no
other child is compiling or verifying and starts no new candidate while one child waits for or
holds the timing phase: timed runs overlap nothing. With ``overlap`` (a pipeline: one more
child than ``parallel_build``), a kernel that leaves cores free is timed while the others
build, the parent pinning the timed child to the timing cores and every other child to the
rest before it says "go" (``cores``); a kernel that needs every core is timed alone as before.
Because the parent holds this state, a child that crashes or is killed in its timing phase
leaves no lock behind: the parent just forgets it.

The parent also keeps the compile cache: it sends a task with its cached object code, and keeps
what a child built (``workers.compile_cache``).

Children come from the ``spawn`` context (safe with the agent's threads), are started only when
a candidate is dispatched (a starting child's imports would disturb a timed run), and are
replaced after a crash, a timeout, or ``max_tasks_per_child`` candidates (bounding leaks).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, NamedTuple

from schedule_templates.protocol import ClaimItem
from schedule_templates.records import ErrorKind, MeasureResult
from workers.backends import BackendSpec, backend_class, create_backend
from workers.compile_cache import CompileCache, CompileKey
from workers.errors import WorkerError
from workers.measure.child import GO, RETIRE, STOP, child_main
from workers.measure.cores import CoreLayout, pin
from workers.measure.runner import Phase
from workers.timings import StageTimes

logger = logging.getLogger(__name__)

#: how long a child that was asked to stop may take before it is killed
STOP_GRACE_S = 2.0
#: what a freshly started child may take to start its interpreter and import the backend before
#: it says it is compiling; the build timeout counts from that message, so a short
#: ``build_timeout_s`` on a loaded machine does not turn a child's start-up into BUILD_TIMEOUT
CHILD_START_S = 30.0
#: numpy computes the reference in the child; a multi-threaded BLAS leaves its threads
#: spinning for a while afterwards, on the cores the timed kernel is about to use (measured:
#: the first claim of a 1.3 ms kernel read 20-40% slow). Unless the user set these, the child
#: runs BLAS on one thread. The kernel's own threads (libgomp) are not affected.
CHILD_ENVIRONMENT = {"OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
#: while a slot is free, how often a stream of tasks is asked for more
STREAM_POLL_S = 0.05


class Measured(NamedTuple):
    """A finished candidate: its result, where its time went (``times.claim_s``, ``report_s``
    and the queue part of ``wait_s`` are the caller's to add) and when it was dispatched
    (``time.monotonic()``)."""

    task: ClaimItem
    result: MeasureResult
    times: StageTimes
    dispatched: float


@dataclasses.dataclass
class _Slot:
    """One child process and the candidate it holds."""

    process: BaseProcess | None = None
    conn: Connection | None = None
    tasks_done: int = 0
    task: ClaimItem | None = None
    phase: Phase | None = None
    granted: bool = False  # holds the timing phase
    started: float = 0.0
    deadline: float = math.inf
    retire: bool = False  # the child's backend is unusable: replace it after this candidate
    key: CompileKey | None = None  # the candidate's compile cache key
    cpus: frozenset[int] | None = None  # the cores the child was last pinned to

    @property
    def busy(self) -> bool:
        return self.task is not None

    @property
    def waiting_for_go(self) -> bool:
        return self.phase is Phase.TIME and not self.granted

    @property
    def building(self) -> bool:
        return self.phase in (Phase.COMPILE, Phase.VERIFY)


class IsolatedMeasurer:
    """Measures tasks in ``parallel_build`` reusable child processes; see the module docstring.

    Use as a context manager (or call ``close``); not thread-safe: one thread drives it.
    """

    def __init__(self, backend: BackendSpec, parallel_build: int = 1,
                 max_tasks_per_child: int = 200, overlap: bool = False,
                 cache: CompileCache | None = None) -> None:
        if parallel_build < 1 or max_tasks_per_child < 1:
            raise WorkerError("parallel_build and max_tasks_per_child must be at least 1")
        create_backend(backend).close()  # fail here, with a clear error, on a bad spec
        self.backend = backend
        self.max_tasks_per_child = max_tasks_per_child
        self.layout = CoreLayout.of_this_process()
        #: builds run beside timed runs (needs at least two cores this process may use)
        self.overlap = overlap and self.layout.overlaps(1)
        self.cache = cache if cache is not None else CompileCache()
        self._backend_class = backend_class(backend.name)
        self._context = multiprocessing.get_context("spawn")
        self._slots = [_Slot() for _ in range(parallel_build + (1 if self.overlap else 0))]
        #: children started so far (for tests and logs: replacements show up here)
        self.children_started = 0

    def __enter__(self) -> IsolatedMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def processes(self) -> int:
        """Measuring processes (builders, and in a pipeline one more that times)."""
        return len(self._slots)

    def measure(self, task: ClaimItem) -> MeasureResult:
        for _task, result in self.measure_many([task]):
            return result
        raise WorkerError("the measurer returned no result")  # only if stopped before start

    def measure_many(self, tasks: Iterable[ClaimItem],
                     should_stop: Callable[[], bool] | None = None
                     ) -> Iterator[tuple[ClaimItem, MeasureResult]]:
        """Yield (task, result) as candidates finish. Once ``should_stop()`` is true no new
        candidate starts; those in flight finish (within their timeouts)."""
        pending = deque(tasks)
        for measured in self.measure_stream(lambda: pending.popleft() if pending else None,
                                            should_stop):
            yield measured.task, measured.result

    def measure_stream(self, next_task: Callable[[], ClaimItem | None],
                       should_stop: Callable[[], bool] | None = None) -> Iterator[Measured]:
        """Measure what ``next_task()`` hands out (it must not block; None: nothing now) until
        it has nothing and nothing is in flight, or ``should_stop()``: then no new candidate
        starts and those in flight finish (within their timeouts)."""
        stopping = False
        try:
            while True:
                stopping = stopping or (should_stop is not None and should_stop())
                self._schedule(_nothing if stopping else next_task)
                if not any(slot.busy for slot in self._slots):
                    return
                yield from self._wait_for_events()
        finally:
            # A caller that stopped iterating early abandons what is in flight.
            for slot in self._slots:
                if slot.busy:
                    self._kill_child(slot)
                    slot.task, slot.phase, slot.granted = None, None, False

    def close(self) -> None:
        for slot in self._slots:
            self._stop_child(slot)

    # -- scheduling ----------------------------------------------------------------------------

    def _schedule(self, next_task: Callable[[], ClaimItem | None]) -> None:
        timing = self._timing_slot()
        waiting = [slot for slot in self._slots if slot.waiting_for_go]
        if timing is None and waiting:
            first = min(waiting, key=lambda slot: slot.started)
            if self._overlaps(first) or not any(slot.building for slot in self._slots):
                self._grant(first)
                timing = first
        # A kernel timed (or about to be) on every core: nothing new may start building.
        exclusive = [s for s in self._slots if (s.granted or s.waiting_for_go)
                     and not self._overlaps(s)]
        if not exclusive:
            for slot in self._slots:
                if slot.busy:
                    continue
                task = next_task()
                if task is None:
                    break
                self._dispatch(slot, task)
        self._apply_affinity()

    def _timing_slot(self) -> _Slot | None:
        return next((slot for slot in self._slots if slot.granted), None)

    def _overlaps(self, slot: _Slot) -> bool:
        return self.overlap and slot.task is not None and self.layout.overlaps(slot.task.threads)

    def _apply_affinity(self) -> None:
        """Pin the timed child to the timing cores and the others off them (see ``cores``)."""
        if not self.overlap:
            return  # nothing pinned: every child keeps the parent's cores
        timing = self._timing_slot()
        threads = timing.task.threads if timing is not None and timing.task is not None else 0
        for slot in self._slots:
            if slot.process is None or slot.process.pid is None:
                continue
            if slot is timing:
                cpus = self.layout.timing(threads)
            elif timing is not None and self._overlaps(timing):
                cpus = self.layout.building(threads)
            else:
                cpus = self.layout.all()
            if cpus != slot.cpus and pin(slot.process.pid, cpus):
                slot.cpus = cpus

    def _grant(self, slot: _Slot) -> None:
        assert slot.conn is not None and slot.task is not None
        slot.granted = True
        slot.deadline = time.monotonic() + slot.task.options.run_timeout_s
        self._apply_affinity()  # before "go": nothing else may be left on the timing cores
        self._send(slot, GO)

    def _dispatch(self, slot: _Slot, task: ClaimItem) -> None:
        start_up = 0.0
        if slot.process is None:
            self._start_child(slot)
            start_up = CHILD_START_S
        slot.task, slot.phase, slot.granted = task, Phase.COMPILE, False
        slot.started = time.monotonic()
        slot.deadline = slot.started + start_up + task.options.build_timeout_s
        slot.key = self._backend_class.cache_key(task, self.backend.options)
        self._send(slot, (task, self.cache.get(slot.key)))

    def _send(self, slot: _Slot, message: Any) -> None:
        assert slot.conn is not None
        # A child that is gone is reported by its sentinel on the next wait.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, EOFError):
            slot.conn.send(message)

    # -- events --------------------------------------------------------------------------------

    def _wait_for_events(self) -> Iterator[Measured]:
        live = [slot for slot in self._slots if slot.busy]
        if not live:
            return
        deadline = min(slot.deadline for slot in live)
        timeout = None if deadline == math.inf else max(0.0, deadline - time.monotonic())
        if len(live) < len(self._slots):  # a free slot: look for new tasks now and then
            timeout = STREAM_POLL_S if timeout is None else min(timeout, STREAM_POLL_S)
        handles: list[Any] = []
        for slot in live:
            handles += [slot.conn, slot.process.sentinel]  # type: ignore[union-attr]
        ready = set(multiprocessing.connection.wait(handles, timeout))
        for slot in live:
            assert slot.conn is not None and slot.process is not None
            if slot.conn in ready or slot.process.sentinel in ready:
                yield from self._read(slot)
            elif time.monotonic() >= slot.deadline:
                yield self._finish(slot, self._timed_out(slot))

    def _read(self, slot: _Slot) -> Iterator[Measured]:
        assert slot.conn is not None and slot.process is not None
        while slot.busy:
            try:
                if not slot.conn.poll():
                    break
                kind, payload = slot.conn.recv()
            except (EOFError, OSError):
                break
            if kind == "done":
                result, stages = payload
                yield self._finish(slot, MeasureResult.from_json(result),
                                   StageTimes.from_json(stages) if stages else None)
            elif kind == "code":
                if slot.key is not None:
                    self.cache.put(slot.key, payload)
            elif kind == RETIRE:
                slot.retire = True
            else:
                self._enter_phase(slot, Phase(payload))
        if slot.busy and not slot.process.is_alive():
            yield self._finish(slot, self._crashed(slot))
        elif not slot.busy and slot.process is not None and not slot.process.is_alive():
            self._forget_child(slot)

    def _enter_phase(self, slot: _Slot, phase: Phase) -> None:
        assert slot.task is not None
        slot.phase = phase
        if phase is Phase.COMPILE:  # the child is ready: the build's own time starts now
            slot.deadline = time.monotonic() + slot.task.options.build_timeout_s
        elif phase is Phase.VERIFY:
            slot.deadline = time.monotonic() + slot.task.options.run_timeout_s
        elif phase is Phase.TIME:
            slot.deadline = math.inf  # waiting for "go" is not the candidate's fault

    def _finish(self, slot: _Slot, result: MeasureResult, times: StageTimes | None = None
                ) -> Measured:
        task = slot.task
        assert task is not None
        if times is None:  # the child died or hung: its whole time goes to the phase it was in
            elapsed = time.monotonic() - slot.started
            stage = {Phase.VERIFY: "check_s", Phase.TIME: "measure_s"}.get(
                slot.phase or Phase.COMPILE, "build_s")
            times = StageTimes(**{stage: elapsed})
        measured = Measured(task, result, times, slot.started)
        slot.task, slot.phase, slot.granted, slot.deadline = None, None, False, math.inf
        slot.key = None
        slot.tasks_done += 1
        if slot.retire or slot.tasks_done >= self.max_tasks_per_child:
            self._stop_child(slot)
        return measured

    # -- classification ------------------------------------------------------------------------

    def _timed_out(self, slot: _Slot) -> MeasureResult:
        assert slot.task is not None
        options = slot.task.options
        building = slot.phase is Phase.COMPILE
        limit = options.build_timeout_s if building else options.run_timeout_s
        kind = ErrorKind.BUILD_TIMEOUT if building else ErrorKind.RUN_TIMEOUT
        what = "building" if building else f"running ({_phase_name(slot)})"
        logger.warning("measure %s: %s exceeded %.3g s; killing its child",
                       slot.task.measure_id, what, limit)
        self._kill_child(slot)
        return MeasureResult.failure(kind, f"{what} exceeded the timeout of {limit:g} s",
                                     wall_time_s=time.monotonic() - slot.started)

    def _crashed(self, slot: _Slot) -> MeasureResult:
        assert slot.task is not None and slot.process is not None
        slot.process.join(STOP_GRACE_S)
        how = describe_exit(slot.process.exitcode)
        building = slot.phase is Phase.COMPILE
        kind = ErrorKind.COMPILE_HOST if building else ErrorKind.RUNTIME
        where = "while building" if building else f"while running ({_phase_name(slot)})"
        logger.warning("measure %s: the child %s %s", slot.task.measure_id, how, where)
        self._forget_child(slot)
        return MeasureResult.failure(kind, f"the measuring process {how} {where}",
                                     wall_time_s=time.monotonic() - slot.started)

    # -- child lifecycle -----------------------------------------------------------------------

    def _start_child(self, slot: _Slot) -> None:
        parent_end, child_end = self._context.Pipe(duplex=True)
        process = self._context.Process(target=child_main, args=(child_end, self.backend),
                                        name="tuner-measure", daemon=True)
        with _child_environment(CHILD_ENVIRONMENT):
            process.start()
        child_end.close()
        slot.process, slot.conn, slot.tasks_done, slot.retire = process, parent_end, 0, False
        slot.cpus = None  # pinned by the next ``_apply_affinity``
        self.children_started += 1

    def _stop_child(self, slot: _Slot) -> None:
        if slot.process is None:
            return
        if slot.process.is_alive():
            self._send(slot, STOP)
            slot.process.join(STOP_GRACE_S)
        self._kill_child(slot)

    def _kill_child(self, slot: _Slot) -> None:
        if slot.process is not None and slot.process.is_alive():
            slot.process.kill()
        self._forget_child(slot)

    def _forget_child(self, slot: _Slot) -> None:
        if slot.process is not None:
            slot.process.join(STOP_GRACE_S)
            slot.process.close()
        if slot.conn is not None:
            slot.conn.close()
        slot.process, slot.conn = None, None


@contextlib.contextmanager
def _child_environment(values: dict[str, str]) -> Iterator[None]:
    """Set variables a spawned child inherits (only those the user left unset), then undo."""
    added = {k: v for k, v in values.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def _nothing() -> ClaimItem | None:
    return None


def _phase_name(slot: _Slot) -> str:
    return slot.phase.value if slot.phase is not None else "idle"


def describe_exit(exitcode: int | None) -> str:
    """``-11`` -> ``"was killed by SIGSEGV"``; ``3`` -> ``"exited with status 3"``."""
    if exitcode is None:
        return "did not exit"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with status {exitcode}"
