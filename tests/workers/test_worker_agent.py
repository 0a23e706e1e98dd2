"""The worker loop against a stub server: reports, outages, the spool, stopping."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.workers.conftest import StubServer, make_item
from workers.agent import run_worker
from workers.settings import WorkerSettings

pytestmark = pytest.mark.timeout(120)


def settings(server: StubServer, tmp_path: Path, **overrides: Any) -> WorkerSettings:
    values: dict[str, Any] = {
        "server": server.url, "token": "secret", "device_key": "test-cpu", "backend": "fake",
        "backend_options": {"validate": False, "faults": {3: "segfault", 4: "wrong"}},
        "spool_dir": tmp_path / "spool", "max_idle_s": 0.3, "poll_s": 0.1, "max_items": 3,
        "shutdown_flush_s": 0.5,
    }
    return WorkerSettings(**{**values, **overrides})


def test_a_worker_measures_everything_and_reports_it(stub_server: StubServer, tmp_path: Path
                                                     ) -> None:
    stub_server.queue += [make_item(i) for i in range(6)]
    assert run_worker(settings(stub_server, tmp_path)) == 0
    assert sorted(stub_server.results) == list(range(6))
    kinds = {i: r["error_kind"] for i, r in stub_server.results.items()}
    assert kinds == {0: 0, 1: 0, 2: 0, 3: 4, 4: 5, 5: 0}
    assert all(len(r["costs"]) == 2 for r in stub_server.results.values() if r["error_kind"] == 0)
    registered = stub_server.registered[0]
    assert registered["device_key"] == "test-cpu" and registered["target"] == "llvm"
    assert registered["hardware"]["logical_cores"] >= 1
    assert {"python", "numpy"} <= set(registered["software"])


def test_heartbeats_list_the_held_items(stub_server: StubServer, tmp_path: Path) -> None:
    stub_server.queue += [make_item(i) for i in range(2)]
    options = {"validate": False, "run_s": 0.6}
    assert run_worker(settings(stub_server, tmp_path, backend_options=options)) == 0
    assert stub_server.heartbeats and set(stub_server.heartbeats[0]) <= {0, 1}


def test_an_outage_loses_no_result(stub_server: StubServer, tmp_path: Path) -> None:
    stub_server.queue += [make_item(i) for i in range(5)]
    stub_server.fail = {"results": 4, "claim": 2, "register": 1}
    assert run_worker(settings(stub_server, tmp_path)) == 0
    assert sorted(stub_server.results) == list(range(5))
    assert not (tmp_path / "spool" / "results.jsonl").read_text().strip()


def test_the_spool_is_resent_by_the_next_worker(stub_server: StubServer, tmp_path: Path
                                                ) -> None:
    stub_server.queue += [make_item(i) for i in range(3)]
    stub_server.fail = {"results": 10**6}
    assert run_worker(settings(stub_server, tmp_path, once=True)) == 0
    assert stub_server.results == {}
    assert len((tmp_path / "spool" / "results.jsonl").read_text().splitlines()) == 3
    stub_server.fail = {}
    assert run_worker(settings(stub_server, tmp_path)) == 0
    assert sorted(stub_server.results) == [0, 1, 2]


def test_bad_items_and_invalid_configs_are_instantiation_errors(stub_server: StubServer,
                                                                 tmp_path: Path) -> None:
    from schedule_templates.templates.base import template_by_name
    from schedule_templates.workloads import parse_workload

    good = template_by_name("dense.x86").default_config(parse_workload(make_item(0)["workload"]))
    stub_server.queue += [make_item(1, index=10**12), make_item(2, template=""),
                          make_item(3, index=good.index)]
    run_worker(settings(stub_server, tmp_path, backend_options={"validate": True}))
    kinds = {i: r["error_kind"] for i, r in stub_server.results.items()}
    assert kinds == {1: 1, 2: 1, 3: 0}


def test_a_wrong_token_exits_with_an_error(stub_server: StubServer, tmp_path: Path) -> None:
    assert run_worker(settings(stub_server, tmp_path, token="wrong")) == 2


def test_sigterm_finishes_the_current_candidate_and_releases_the_rest(
        stub_server: StubServer, tmp_path: Path) -> None:
    stub_server.queue += [make_item(i) for i in range(4)]
    command = [sys.executable, "-m", "tuner_service.cli.main", "worker", "--server",
               stub_server.url, "--device-key", "test-cpu", "--backend", "fake",
               "--spool-dir", str(tmp_path / "spool"), "--poll-s", "0.1", "--max-items", "4"]
    options = ["--backend-option", "run_s=1.0", "--backend-option", "validate=false"]
    process = subprocess.Popen(command + options, env={**os.environ, "TUNER_TOKEN": "secret"})
    try:
        deadline = time.monotonic() + 30
        while not stub_server.leased and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # inside the first candidate's 1 s run
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()
    assert len(stub_server.results) >= 1
    assert stub_server.released and not stub_server.leased
    assert set(stub_server.results) | set(stub_server.released) == {0, 1, 2, 3}


def test_results_and_registration_carry_the_measured_peak(stub_server: StubServer,
                                                          tmp_path: Path) -> None:
    stub_server.queue += [make_item(i) for i in range(3)]
    options = {"validate": False, "peak_gflops": 40.0}
    assert run_worker(settings(stub_server, tmp_path, backend_options=options, threads=2)) == 0
    assert stub_server.registered[0]["hardware"]["peak_gflops"] == {"2": 80.0}
    threads = {i: min(2, make_item(i).get("threads", 1)) for i in range(3)}
    assert {i: r["peak_gflops"] for i, r in stub_server.results.items()} == {
        i: 40.0 * t for i, t in threads.items()}


def test_the_llvm_backend_measures_a_plausible_peak() -> None:
    from workers.backends import BackendSpec
    from workers.peak import PeakGauge

    gauge = PeakGauge(BackendSpec("llvm"))
    try:
        peak = gauge.peak(1)
    finally:
        gauge.close()
    # An FMA loop on any x86-64 with SSE2 does at least a few GFLOPS, and no core does 10^4.
    assert peak is not None and 1.0 < peak < 1e4
    assert gauge.known() == {"1": round(peak, 1)}
