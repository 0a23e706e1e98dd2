"""Claims ahead and reports in batches, on a thread beside the measuring loop.

A claim is an HTTP round trip, a long poll when the server has nothing; a report is another.
Made between candidates, both leave the measuring processes idle (the timing core waits for a
"go" the main loop cannot give while it is in a request). So one thread does all the talking:
it keeps ``depth`` claimed tasks queued ahead of the measurer, and hands in the spool when
``report_batch`` results wait or the oldest has waited ``report_interval_s``. It long-polls
only when the queue is empty, and then no longer than results may wait.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from schedule_templates.protocol import ClaimItem, MeasureId
from workers.backoff import Backoff
from workers.errors import ServerUnavailable, WorkerError

logger = logging.getLogger(__name__)

#: after a claim came back empty without a long poll, wait this long (at most) to ask again
EMPTY_CLAIM_PAUSE_S = 1.0
#: how often the thread looks at the queue and the spool when nothing wakes it
IDLE_WAKE_S = 0.05


@dataclasses.dataclass(frozen=True)
class Claimed:
    """A queued task and when and how fast its claim answered."""

    task: ClaimItem
    claimed_at: float  # time.monotonic() when the claim answered
    claim_s: float  # the claim request's round trip


#: ``claim(wait_s, max_items)``: the tasks of one claim request (malformed items answered)
ClaimCall = Callable[[float, int], list[ClaimItem]]
#: ``report()``: one attempt to hand in the spool; True when it is empty afterwards
ReportCall = Callable[[], bool]


class Feed:
    """Prefetched tasks and batched reports; a context manager running the thread."""

    def __init__(self, claim: ClaimCall, report: ReportCall, waiting: Callable[[], int], *,
                 depth: int, poll_s: float, report_batch: int = 32,
                 report_interval_s: float = 1.0, backoff_cap_s: float = 30.0) -> None:
        self._claim, self._report, self._waiting = claim, report, waiting
        self.depth = max(1, depth)
        self.poll_s = poll_s
        self.report_batch = max(1, report_batch)
        self.report_interval_s = report_interval_s
        self._queue: collections.deque[Claimed] = collections.deque()
        self._claims: dict[MeasureId, Claimed] = {}
        self._lock = threading.Condition()
        self._done = threading.Event()
        self._wake = threading.Event()
        self._backoff = Backoff(cap_s=backoff_cap_s)
        self._retry_after_s = 0.0
        self._thread = threading.Thread(target=self._run, name="tuner-feed", daemon=True)
        #: what stopped the thread (a refused token): the main loop raises it
        self.error: WorkerError | None = None
        #: the last claim was answered, with nothing (not failed: an outage is not idleness)
        self.answered_empty = False

    def __enter__(self) -> Feed:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._wake.set()
        self._thread.join()

    # -- the measuring loop's side ---------------------------------------------------------------

    def next_task(self) -> ClaimItem | None:
        """The next queued task, without waiting."""
        with self._lock:
            if not self._queue:
                return None
            claimed = self._queue.popleft()
            self._claims[claimed.task.measure_id] = claimed
        self._wake.set()  # room in the queue: claim more
        return claimed.task

    def wait_for_work(self, timeout_s: float) -> bool:
        with self._lock:
            return self._lock.wait_for(lambda: bool(self._queue) or self.error is not None,
                                       timeout_s) and bool(self._queue)

    def claim_of(self, measure_id: MeasureId) -> Claimed | None:
        """How the task came (forgotten once asked)."""
        with self._lock:
            return self._claims.pop(measure_id, None)

    def result_added(self) -> None:
        if self._waiting() >= self.report_batch:
            self._wake.set()

    def unstarted(self) -> list[MeasureId]:
        """Empty the queue; the ids of the tasks that never started."""
        with self._lock:
            ids = [c.task.measure_id for c in self._queue]
            self._queue.clear()
        return ids

    # -- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as e:  # a bug: stop the worker with it rather than starve it quietly
            logger.exception("the feed thread failed")
            self._fail(WorkerError(f"the feed thread failed: {type(e).__name__}: {e}"))

    def _fail(self, error: WorkerError) -> None:
        self.error = error
        self._done.set()
        with self._lock:
            self._lock.notify_all()

    def _loop(self) -> None:
        last_report = time.monotonic()
        next_report = next_claim = 0.0  # the earliest next try after a failure
        while not self._done.is_set():
            now = time.monotonic()
            waiting = self._waiting()
            if waiting and now >= next_report and (
                    waiting >= self.report_batch or now - last_report >= self.report_interval_s):
                if self._safely(self._report):
                    last_report = now
                else:
                    next_report = time.monotonic() + self._pause()
            with self._lock:
                queued = len(self._queue)
            if queued < self.depth and now >= next_claim:
                wait_s = 0.0 if queued else self.poll_s
                if self._waiting():  # results must not wait behind a long poll
                    wait_s = min(wait_s, self.report_interval_s)
                got = self._fetch(wait_s, self.depth - queued)
                if got is None:
                    next_claim = time.monotonic() + self._pause()
                elif got == 0 and (queued or wait_s < self.poll_s):
                    # nothing, and the server did not hold the request: do not ask at once
                    next_claim = time.monotonic() + min(EMPTY_CLAIM_PAUSE_S,
                                                        max(self.poll_s, IDLE_WAKE_S))
                continue
            self._wake.wait(IDLE_WAKE_S)
            self._wake.clear()

    def _fetch(self, wait_s: float, max_items: int) -> int | None:
        """Claim once; the tasks it queued, None when the server was unavailable."""
        start = time.monotonic()
        tasks: list[ClaimItem] | None = None

        def claim() -> bool:
            nonlocal tasks
            tasks = self._claim(wait_s, max_items)
            return True

        if not self._safely(claim) or tasks is None:
            self.answered_empty = False
            return None
        self.answered_empty = not tasks
        now = time.monotonic()
        with self._lock:
            self._queue.extend(Claimed(t, now, now - start) for t in tasks)
            self._lock.notify_all()
        return len(tasks)

    def _safely(self, call: Callable[[], bool]) -> bool:
        """``call()``; False when the server is unavailable. Anything else that the worker
        cannot get past stops the thread and is kept for the main loop."""
        try:
            ok = call()
        except ServerUnavailable as e:
            logger.warning("server unavailable: %s", e)
            self._retry_after_s = e.retry_after_s or 0.0
            return False
        except WorkerError as e:
            self._fail(e)
            return False
        if ok:
            self._backoff.reset()
        return ok

    def _pause(self) -> float:
        """How long to leave the server alone after a failure (its Retry-After at least)."""
        return max(self._backoff.next_delay(), self._retry_after_s)
