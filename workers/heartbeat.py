"""A background thread that extends the leases of the items a worker still holds."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from schedule_templates.protocol import MeasureId
from workers.client import ServerClient
from workers.errors import WorkerError

logger = logging.getLogger(__name__)


class HeldItems:
    """Ids leased to this worker and not yet acknowledged; shared with the heartbeat thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[MeasureId, None] = {}

    def add(self, ids: Iterable[MeasureId]) -> None:
        with self._lock:
            self._ids.update(dict.fromkeys(ids))

    def discard(self, ids: Iterable[MeasureId]) -> None:
        with self._lock:
            for i in ids:
                self._ids.pop(i, None)

    def snapshot(self) -> list[MeasureId]:
        with self._lock:
            return list(self._ids)


class Heartbeat:
    """Posts a heartbeat every ``interval_s`` while items are held. A context manager.
    ``worker_id`` may be a function: a worker that registers again gets a new id meanwhile."""

    def __init__(self, client: ServerClient, worker_id: str | Callable[[], str],
                 held: HeldItems, interval_s: float) -> None:
        self._client = client
        self._worker_id = worker_id if callable(worker_id) else (lambda: worker_id)
        self._held = held
        self._interval_s = max(0.05, interval_s)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tuner-heartbeat", daemon=True)
        #: heartbeats the server answered (for tests and logs)
        self.sent = 0

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._done.wait(self._interval_s):
            ids = self._held.snapshot()
            if not ids:
                continue
            try:
                answer = self._client.heartbeat(self._worker_id(), ids)
            except WorkerError as e:
                logger.warning("heartbeat failed (leases may lapse): %s", e)
                continue
            self.sent += 1
            lost = answer.get("lost") or []
            if lost:
                # Keep measuring: the server refuses those results (status ``expired`` or
                # ``not_leased_by_you``) and the spool drops them; the rest still count.
                logger.warning("the server says %d held item(s) lost their lease", len(lost))
