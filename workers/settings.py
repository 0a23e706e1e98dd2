"""The worker's settings: a frozen dataclass filled by the CLI (no pydantic on a worker)."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def default_spool_dir() -> Path:
    return Path.home() / ".tuner" / "spool"


@dataclasses.dataclass(frozen=True)
class WorkerSettings:
    server: str
    token: str
    device_key: str
    target: str = "llvm"
    backend: str = "llvm"
    backend_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    name: str = dataclasses.field(default_factory=socket.gethostname)
    #: candidates compiled at once (timed runs are always one at a time)
    parallel_build: int = 1
    #: most threads a kernel may use; also the count for items that name none (0: all cores)
    threads: int = 0
    spool_dir: Path = dataclasses.field(default_factory=default_spool_dir)
    #: exit after this long without work (None: never)
    max_idle_s: float | None = None
    #: exit after one batch has been measured and acknowledged
    once: bool = False
    #: long-poll wait per claim; also bounds how long a stop request waits for a claim
    poll_s: float = 5.0
    #: items per claim (0: one per build slot)
    max_items: int = 0
    max_tasks_per_child: int = 200
    #: claim ahead and report in batches on a feed thread (False: claim one batch, measure it,
    #: report each result as it finishes, and only then claim again)
    pipeline: bool = True
    #: build candidates on the cores a timed kernel leaves free (one more measuring process)
    overlap_builds: bool = True
    #: tasks claimed ahead of the measurer (0: two per measuring process); once mode claims
    #: one batch and measures it, without a feed thread
    prefetch: int = 0
    #: results per report, and the longest a finished result waits for one
    report_batch: int = 32
    report_interval_s: float = 1.0
    #: compiled candidates kept across claims (``workers.compile_cache``)
    compile_cache_entries: int = 2048
    compile_cache_mb: float = 64.0
    request_timeout_s: float = 30.0
    backoff_cap_s: float = 30.0
    #: how long a stopping worker keeps trying to hand in spooled results
    shutdown_flush_s: float = 15.0

    def __post_init__(self) -> None:
        for name in ("server", "token", "device_key", "target"):
            if not getattr(self, name):
                raise ValueError(f"worker setting {name!r} must not be empty")
        if self.parallel_build < 1 or self.threads < 0 or self.max_items < 0:
            raise ValueError("parallel_build must be >= 1; threads and max_items >= 0")
        if self.prefetch < 0 or self.report_batch < 1 or self.report_interval_s < 0:
            raise ValueError("prefetch must be >= 0, report_batch >= 1, report_interval_s >= 0")
        if self.compile_cache_entries < 0 or self.compile_cache_mb < 0:
            raise ValueError("the compile cache bounds must be >= 0")

    @property
    def claim_size(self) -> int:
        return self.max_items or self.parallel_build
