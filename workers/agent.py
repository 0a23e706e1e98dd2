"""The worker loop: register, claim (long-poll), measure in isolation, report; survive outages.

A pipeline: a feed thread claims ahead and reports in batches (``feed``), the measurer builds
the next candidates on the cores a timed kernel leaves free and reuses compiled code across
claims (``measure.pool``, ``compile_cache``), and every result carries where its time went
(``timings``). This process's own threads are kept off the timing core while it runs.

Results go to the on-disk spool before they are sent, and leave it only when the server has
acknowledged them (accepted, duplicate or rejected), so a server or network outage loses
nothing: the worker backs off, keeps the results, and sends them again (reports are
idempotent). SIGTERM/SIGINT: candidates in flight finish, unstarted ones are released, the
spool is flushed, and the process exits 0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from schedule_templates.protocol import ClaimItem, MeasureId, MessageError, Report, measure_id_of
from schedule_templates.records import ErrorKind, MeasureResult
from workers.backends import BackendSpec, accelerator_facts, backend_class
from workers.backoff import Backoff
from workers.client import ServerClient
from workers.compile_cache import CompileCache
from workers.device_class import DeviceClass, DeviceClassError
from workers.errors import ProtocolError, ServerRejected, ServerUnavailable, WorkerError
from workers.feed import Claimed, Feed
from workers.hardware import cpu_facts, device_class, software_versions
from workers.heartbeat import Heartbeat, HeldItems
from workers.measure.cores import pinned
from workers.measure.pool import IsolatedMeasurer, Measured
from workers.peak import PeakGauge
from workers.settings import WorkerSettings
from workers.spool import Spool
from workers.timings import StageTimes

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: results per report request
REPORT_CHUNK = 100
#: exit status when the worker cannot run (refused credentials, a locked spool, a bad backend)
EXIT_ERROR = 2


class Agent:
    def __init__(self, settings: WorkerSettings, client: ServerClient, spool: Spool,
                 measurer: IsolatedMeasurer, stop: threading.Event,
                 peaks: PeakGauge | None = None) -> None:
        self.settings = settings
        self.client = client
        self.spool = spool
        self.measurer = measurer
        self.stop = stop
        self.held = HeldItems()
        self.worker_id = ""
        #: the normalised device class every result is reported with (set at registration)
        self.device_class = ""
        self.heartbeat_s = 10.0
        self.measured = 0
        self.peaks = peaks
        #: measure id -> threads it runs on, for the peak reported with its result
        self._threads: dict[MeasureId, int] = {}
        self._backoff = Backoff(cap_s=settings.backoff_cap_s)
        self._register_lock = threading.Lock()

    def run(self) -> int:
        """Work until stopped, idle for ``max_idle_s``, or done with one batch (``once``)."""
        if not self._register():
            return 0
        if self.settings.once or not self.settings.pipeline:
            self._run_batches()
        else:
            self._run_pipelined()
        self._final_flush()
        return 0

    def _run_batches(self) -> None:
        """Claim, measure and report one batch at a time (``once``: a single batch)."""
        idle_since = time.monotonic()
        while not self.stop.is_set():
            self._flush_spool()  # results first: claiming more while they wait helps nobody
            start = time.monotonic()
            items = self._claim(self.settings.claim_size, self.settings.poll_s, retry=True)
            if items:
                self._process(items, start)
                idle_since = time.monotonic()
                if self.settings.once:
                    break
            elif self._idle_too_long(idle_since):
                break

    def _run_pipelined(self) -> None:
        """Measure what the feed thread claims ahead, as long as there is work."""
        self._measure_peaks()  # now, on every core, while nothing is being timed
        feed = Feed(self._claim_tasks, self._report_once, lambda: len(self.spool),
                    depth=self.settings.prefetch or 2 * self.measurer.processes,
                    poll_s=self.settings.poll_s, report_batch=self.settings.report_batch,
                    report_interval_s=self.settings.report_interval_s,
                    backoff_cap_s=self.settings.backoff_cap_s)
        idle_since = time.monotonic()
        # This thread and those it starts (feed, heartbeat) stay off the timing core.
        layout = self.measurer.layout
        cores = layout.building(1) if self.measurer.overlap else layout.all()
        with pinned(cores), Heartbeat(self.client, lambda: self.worker_id, self.held,
                                      self.heartbeat_s), feed:
            while not self.stop.is_set() and feed.error is None:
                if not feed.wait_for_work(self.settings.poll_s):
                    if (feed.answered_empty and not len(self.spool)
                            and self._idle_too_long(idle_since)):
                        break
                    continue
                for measured in self.measurer.measure_stream(feed.next_task, self.stop.is_set):
                    self._spool_measured(measured, feed.claim_of(measured.task.measure_id))
                    feed.result_added()
                idle_since = time.monotonic()
        unstarted = feed.unstarted()  # after the feed stopped: a claim in flight has landed
        if unstarted:
            self._release(unstarted)
        if feed.error is not None:
            raise feed.error

    def _idle_too_long(self, idle_since: float) -> bool:
        if (self.settings.max_idle_s is not None
                and time.monotonic() - idle_since >= self.settings.max_idle_s):
            logger.info("no work for %.0f s; exiting", self.settings.max_idle_s)
            return True
        return False

    def _measure_peaks(self) -> None:
        if self.peaks is not None:
            for threads in range(1, self._max_threads() + 1):
                self.peaks.peak(threads)

    # -- server calls with retries ---------------------------------------------------------------

    def _register(self) -> bool:
        options = dict(self.settings.backend_options)
        hardware = {**cpu_facts(), "threads": self._max_threads(),
                    "parallel_build": self.settings.parallel_build,
                    **self._peak_facts(),
                    **accelerator_facts(self.settings.backend, options)}
        declared = backend_class(self.settings.backend).declared_device_class(options)
        try:
            self.device_class = device_class(hardware, declared).id
        except DeviceClassError as e:  # a mistyped --backend-option device_class=...
            raise WorkerError(str(e)) from e
        hardware["device_class"] = DeviceClass.parse(self.device_class).to_json()
        body = {
            "device_key": self.settings.device_key,
            "target": self.settings.target,
            "name": self.settings.name,
            "hardware": hardware,
            "software": {**software_versions(), "backend": self.settings.backend},
        }
        with self._register_lock:  # the feed thread registers again after a 404 too
            answer = self._retry("register", lambda: self.client.register(body))
        if answer is None:
            return False
        self.worker_id = str(answer["worker_id"])
        lease_s = float(answer.get("lease_s") or 30.0)
        self.heartbeat_s = float(answer.get("heartbeat_s") or lease_s / 3)
        logger.info("registered as worker %s (device key %s, class %s, target %s)",
                    self.worker_id, self.settings.device_key, self.device_class,
                    self.settings.target)
        return True

    def _claim(self, max_items: int, wait_s: float, retry: bool) -> list[dict[str, Any]]:
        """One claim (with ``retry``: repeated while the server is unavailable); nothing when
        the server forgot this worker, which registers again."""
        def claim() -> list[dict[str, Any]]:
            return self.client.claim(self.worker_id, max_items, wait_s)

        try:
            return (self._retry("claim", claim) if retry else claim()) or []
        except ServerRejected as e:
            if e.status != 404:
                raise
            logger.warning("the server forgot this worker; registering again")
            self._register()
            return []

    def _claim_tasks(self, wait_s: float, max_items: int) -> list[ClaimItem]:
        """One claim for the feed thread: parsed tasks, held and heartbeated from now on."""
        items = self._claim(self.settings.max_items or max_items, wait_s, retry=False)
        tasks = self._parse_items(items)
        self._threads.update({t.measure_id: t.threads for t in tasks})
        self.held.add(t.measure_id for t in tasks)
        return tasks

    def _retry(self, what: str, call: Callable[[], T]) -> T | None:
        """``call()`` until it succeeds, backing off while the server is unavailable; None
        when the worker is asked to stop first."""
        while not self.stop.is_set():
            try:
                answer = call()
            except ServerUnavailable as e:
                delay = max(self._backoff.next_delay(), e.retry_after_s or 0.0)
                logger.warning("%s: %s; retrying in %.1f s", what, e, delay)
                self.stop.wait(delay)
                continue
            self._backoff.reset()
            return answer
        return None

    # -- one batch ---------------------------------------------------------------------------

    def _process(self, items: list[dict[str, Any]], claim_started: float) -> None:
        claimed_at = time.monotonic()
        tasks = self._parse_items(items)
        self._threads = {t.measure_id: t.threads for t in tasks}
        if self.peaks is not None:  # measured now, while no kernel is being timed
            for threads in sorted({t.threads for t in tasks}):
                self.peaks.peak(threads)
        self.held.add(t.measure_id for t in tasks)
        pending = deque(tasks)
        finished: set[MeasureId] = set()
        reachable = True
        with Heartbeat(self.client, self.worker_id, self.held, self.heartbeat_s):
            for measured in self.measurer.measure_stream(
                    lambda: pending.popleft() if pending else None, self.stop.is_set):
                self._spool_measured(measured, Claimed(measured.task, claimed_at,
                                                       claimed_at - claim_started))
                finished.add(measured.task.measure_id)
                # Once a report fails, the rest of the batch waits in the spool: a server that
                # hangs would otherwise cost a request timeout per candidate.
                reachable = reachable and self._report_once()
            unstarted = [t.measure_id for t in tasks if t.measure_id not in finished]
            if unstarted:
                self._release(unstarted)

    def _parse_items(self, items: list[dict[str, Any]]) -> list[ClaimItem]:
        tasks = []
        for item in items:
            try:
                tasks.append(self._with_threads(ClaimItem.from_json(item)))
            except MessageError as e:
                measure_id = measure_id_of(item)
                logger.warning("malformed item: %s", e)
                if measure_id is not None:  # answer it, or it comes back after every lease
                    self._spool_result(measure_id, MeasureResult.failure(
                        ErrorKind.INSTANTIATION, str(e)))
        return tasks

    def _spool_measured(self, measured: Measured, claimed: Claimed | None) -> None:
        times = measured.times
        if claimed is not None:
            queued = max(0.0, measured.dispatched - claimed.claimed_at)
            times = dataclasses.replace(times, claim_s=claimed.claim_s,
                                        wait_s=times.wait_s + queued)
        self._spool_result(measured.task.measure_id, measured.result, times)
        self.measured += 1

    def _spool_result(self, measure_id: MeasureId, result: MeasureResult,
                      times: StageTimes | None = None) -> None:
        threads = self._threads.pop(measure_id, None)
        peak = self.peaks.peak(threads) if self.peaks is not None and threads else None
        entry = Report(measure_id, result, peak, self.device_class or None, threads,
                       times.to_json() if times is not None else None).to_json()
        if times is not None:  # ``finished_at`` becomes ``timings.report_s`` when it is sent
            entry["finished_at"] = time.time()
        self.spool.add(entry)

    def _peak_facts(self) -> dict[str, Any]:
        if self.peaks is None:
            return {}
        self.peaks.peak(self._max_threads())
        return {"peak_gflops": self.peaks.known()}

    def _with_threads(self, task: ClaimItem) -> ClaimItem:
        threads = min(task.threads, self._max_threads())
        if threads == task.threads:
            return task
        logger.warning("measure %s asks for %d threads; this worker allows %d",
                       task.measure_id, task.threads, threads)
        return dataclasses.replace(task, threads=threads)

    def _max_threads(self) -> int:
        if self.settings.threads:
            return self.settings.threads
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1

    def _release(self, ids: list[MeasureId]) -> None:
        try:
            released = self.client.release(self.worker_id, ids)
            logger.info("released %d unstarted item(s)", len(released))
        except WorkerError as e:  # their leases lapse on their own
            logger.warning("could not release %d item(s): %s", len(ids), e)
        self.held.discard(ids)

    # -- reporting ---------------------------------------------------------------------------

    def _report_once(self) -> bool:
        """One attempt to hand in the spool; True when it is empty afterwards."""
        while len(self.spool):
            chunk = self.spool.pending()[:REPORT_CHUNK]
            try:
                self._report_chunk(chunk)
            except ServerUnavailable as e:
                logger.warning("reporting %d result(s) failed: %s", len(chunk), e)
                return False
            except ServerRejected as e:
                if e.status != 404:
                    raise
                self._register()
                return False
        return True

    def _report_chunk(self, chunk: list[dict[str, Any]]) -> None:
        try:
            answer = self.client.report(self.worker_id, [_outgoing(r) for r in chunk])
            self._acknowledge(chunk, answer)
        except ServerRejected as e:
            if e.status in (401, 403, 404):
                raise
            # The server refuses the request itself (a malformed result): find the culprit by
            # sending one at a time, and drop only that one so the spool cannot jam.
            if len(chunk) > 1:
                for result in chunk:
                    self._report_chunk([result])
                return
            logger.error("the server refuses result %s, dropping it: %s",
                         chunk[0]["measure_id"], e)
            self.spool.remove([chunk[0]["measure_id"]])
            self.held.discard([chunk[0]["measure_id"]])

    def _acknowledge(self, chunk: list[dict[str, Any]], answer: dict[str, Any]) -> None:
        done = [*answer.get("accepted", []), *answer.get("duplicates", [])]
        for rejected in answer.get("rejected", []):
            logger.warning("the server rejected result %s: %s",
                           rejected.get("measure_id"), rejected.get("reason"))
            done.append(rejected.get("measure_id"))
        sent = {r["measure_id"] for r in chunk}
        acknowledged = [i for i in done if i in sent]
        if not acknowledged:
            raise ProtocolError(f"the server acknowledged none of {len(chunk)} result(s)")
        self.spool.remove(acknowledged)
        self.held.discard(acknowledged)

    def _flush_spool(self) -> None:
        """Retry with backoff until the spool is empty or the worker is stopping."""
        while not self.stop.is_set() and not self._report_once():
            delay = self._backoff.next_delay()
            logger.info("%d result(s) spooled; retrying in %.1f s", len(self.spool), delay)
            self.stop.wait(delay)
        self._backoff.reset()

    def _final_flush(self) -> None:
        deadline = time.monotonic() + self.settings.shutdown_flush_s
        backoff = Backoff(initial_s=0.2, cap_s=2.0)
        while not self._report_once():
            if time.monotonic() >= deadline:
                logger.warning("exiting with %d result(s) in the spool %s; they are sent on "
                               "the next start", len(self.spool), self.spool.path)
                return
            time.sleep(backoff.next_delay())


def _outgoing(result: dict[str, Any]) -> dict[str, Any]:
    """A spooled result as sent: ``timings.report_s`` is how long it waited to be sent."""
    out = dict(result)
    finished = out.pop("finished_at", None)
    timings = out.get("timings")
    if isinstance(timings, dict) and isinstance(finished, int | float):
        out["timings"] = {**timings, "report_s": round(max(0.0, time.time() - finished), 6)}
    return out


def run_worker(settings: WorkerSettings) -> int:
    """Run a worker until it is stopped; returns the process exit status."""
    stop = threading.Event()
    spec = BackendSpec(settings.backend, dict(settings.backend_options))
    try:
        with contextlib.ExitStack() as stack:
            # several workers on one host share the default directory, each in its own slot
            spool = stack.enter_context(Spool.acquire(settings.spool_dir))
            client = stack.enter_context(ServerClient(settings.server, settings.token,
                                                      settings.request_timeout_s))
            cache = CompileCache(settings.compile_cache_entries,
                                 int(settings.compile_cache_mb * 1024 * 1024))
            measurer = stack.enter_context(IsolatedMeasurer(
                spec, settings.parallel_build, settings.max_tasks_per_child,
                overlap=settings.overlap_builds, cache=cache))
            stack.enter_context(_stop_on_signals(stop))
            peaks = PeakGauge(spec)
            stack.callback(peaks.close)
            return Agent(settings, client, spool, measurer, stop, peaks).run()
    except WorkerError as e:  # ServerRejected (a bad token), a locked spool, a bad backend
        logger.error("worker stopped: %s", e)
        return EXIT_ERROR


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM/SIGINT ask the loop to finish; a second one aborts (KeyboardInterrupt)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        logger.info("%s: finishing the current candidates, then exiting",
                    signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
