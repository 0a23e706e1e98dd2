"""Finished results that the server has not acknowledged yet, kept on disk.

A JSON-lines file, appended and fsync'd once per result, so that a result survives the worker
process, the server and the network going away. Acknowledged results are dropped by rewriting
the file atomically. A lock file keeps two workers from sharing one spool directory;
``Spool.acquire`` gives a second worker on the same host a slot of its own beside the first
(``worker-2``, ``worker-3``... inside the directory), so several workers run with the default.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from schedule_templates.protocol import MeasureId
from workers.errors import WorkerError

logger = logging.getLogger(__name__)

FILE_NAME = "results.jsonl"
LOCK_NAME = "spool.lock"
#: slots a host may hold beside the base directory (one per worker process at a time)
MAX_SLOTS = 256


class SpoolLocked(WorkerError):
    """Another live worker process holds this spool directory."""


class Spool:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / FILE_NAME
        self._lock = open(self.directory / LOCK_NAME, "a+")  # noqa: SIM115 (held while open)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            self._lock.close()
            raise SpoolLocked(f"another worker is using the spool in {self.directory}") from e
        self._entries: dict[MeasureId, dict[str, Any]] = self._load()
        #: the measuring loop adds while the feed thread reports (``workers.feed``)
        self._mutex = threading.RLock()

    @classmethod
    def acquire(cls, directory: Path) -> Spool:
        """The spool in ``directory`` or, while another worker holds it, the first free slot
        ``directory/worker-N``. A slot left by a worker that died is taken over with what it
        holds, so its unacknowledged results are still sent (the server decides if they count)."""
        base = Path(directory)
        for slot in range(1, MAX_SLOTS + 1):
            path = base if slot == 1 else base / f"worker-{slot}"
            try:
                spool = cls(path)
            except SpoolLocked:
                continue
            if slot > 1:
                logger.info("spool %s is in use by another worker; using %s", base, path)
            return spool
        raise WorkerError(f"all {MAX_SLOTS} spool slots in {base} are in use")

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        with self._mutex:
            return len(self._entries)

    def add(self, result: dict[str, Any]) -> None:
        """Keep one result (a protocol ``result`` object with its ``measure_id``) durably."""
        line = json.dumps(result, separators=(",", ":")) + "\n"
        with self._mutex, open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
            self._entries[result["measure_id"]] = result

    def pending(self) -> list[dict[str, Any]]:
        with self._mutex:
            return list(self._entries.values())

    def remove(self, measure_ids: Iterable[MeasureId]) -> None:
        """Forget acknowledged results."""
        with self._mutex:
            removed = [i for i in measure_ids if self._entries.pop(i, None) is not None]
            if removed:
                self._rewrite()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._lock.close()

    def _load(self) -> dict[MeasureId, dict[str, Any]]:
        entries: dict[MeasureId, dict[str, Any]] = {}
        if not self.path.exists():
            return entries
        for number, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                result = json.loads(line)
                entries[result["measure_id"]] = result
            except (ValueError, KeyError, TypeError):
                # A torn last line from a crash mid-write: that result was never acknowledged
                # and its item goes back to the queue when its lease expires.
                logger.warning("spool %s: skipping unreadable line %d", self.path, number)
        if entries:
            logger.info("spool %s holds %d unacknowledged result(s)", self.path, len(entries))
        return entries

    def _rewrite(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for result in self._entries.values():
                f.write(json.dumps(result, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        directory = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
