"""Load: 64 concurrent fake workers claim and report against one live server on PostgreSQL for
a bounded time. No item is held by two workers at once, none is claimed twice, every claimed
item is acknowledged and stored once with the worker that reported it."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from rel_live import ADMIN, ROOT

from tests.reliability.conftest import Launcher

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(300)]

WORKERS = 64
DURATION_S = 10.0


def bench_service() -> ModuleType:
    """``bench/service.py`` (the load generator the benchmark reports from)."""
    spec = importlib.util.spec_from_file_location("bench_service", ROOT / "bench" / "service.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_64_workers_claim_and_report_without_overlap_or_loss(
        pg_url: str, launch: Launcher, db_rows: Callable[..., list[Any]]) -> None:
    # pg_url first: fixtures tear down in reverse, so the server stops before the schema goes
    bench = bench_service()
    server = launch.server(pg_url, lease_s=60.0, batch_size=16, queue_per_worker=4)
    job_id = bench.submit_load_job(server.url, ADMIN, device_key="rel-load")
    stats = bench.run_load(server.url, ADMIN, workers=WORKERS, duration_s=DURATION_S,
                           device_key="rel-load")
    report = bench.summary(stats, WORKERS, DURATION_S)

    assert not stats.errors, stats.errors[:5]
    assert report["overlaps"] == report["claimed_more_than_once"] == 0, report
    assert report["unacknowledged"] == report["duplicates"] == report["rejected"] == 0, report
    assert report["accepted"] == report["items_claimed"] > WORKERS, report

    rows = db_rows(pg_url, """
        SELECT m.id, m.state, m.worker_id FROM measurements m
        JOIN job_tasks t ON t.id = m.job_task_id WHERE t.job_id = :j""", j=job_id)
    done = {r.id: r.worker_id for r in rows if r.state == "done"}
    assert done == stats.accepted  # every acknowledged result stored, by its own worker
    counted = db_rows(pg_url, "SELECT SUM(trials_done) FROM job_tasks WHERE job_id = :j",
                      j=job_id)[0][0]
    assert counted == len(done)  # counted once each
    leased = [r for r in rows if r.state == "leased"]
    assert not leased  # every worker reported what it held before stopping
    registered = db_rows(pg_url, "SELECT COUNT(*) FROM workers")[0][0]
    assert registered == WORKERS and len(set(done.values())) > 1
