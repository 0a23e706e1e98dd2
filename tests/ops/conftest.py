"""Fixtures for the operations tests (helpers in ops_live.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from ops_live import LiveServer, WorkerProcesses


@pytest.fixture
def live_server(migrated_url: str, tmp_path: Path) -> Iterator[LiveServer]:
    server = LiveServer(migrated_url, tmp_path / "data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def worker_processes(tmp_path: Path) -> Iterator[WorkerProcesses]:
    workers = WorkerProcesses(tmp_path)
    try:
        yield workers
    finally:
        workers.stop_all()
