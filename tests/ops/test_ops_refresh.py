"""``tuner refresh`` against a live server with seeded stale entries and two worker processes
(the real ``tuner worker`` loop with the fake backend, one per target)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from ops_live import LiveServer, WorkerProcesses, wait_until

from schedule_templates.templates.base import get_template
from schedule_templates.workloads import parse_workload
from tuner_service.cli.main import build_parser, main
from tuner_service.db.engine import Database
from tuner_service.db.models import TuningLogEntry
from workers.backends.fake import FAKE_DEVICE_CLASS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LLVM, ZEN4, ICELAKE = "llvm", "llvm -mcpu=znver4", "llvm -mcpu=icelake-server"
AGED, OLD_TEMPLATE, FRESH, ORPHAN = (f"dense:M={n},N={n},K={n}" for n in (32, 16, 48, 24))


def config_json(workload: str) -> dict[str, Any]:
    w = parse_workload(workload)
    return dict(get_template(w.op, LLVM).default_config(w).to_json())


def record(workload: str, when: dt.datetime, uid: str) -> str:
    return json.dumps({
        "uid": uid, "workload": workload, "target": LLVM, "template": "dense.x86",
        "template_version": get_template("dense", LLVM).version,
        "config": config_json(workload), "device_key": "epyc", "timestamp": when.isoformat(),
        "result": {"costs": [2e-5, 2.2e-5], "error_kind": 0, "error_message": "",
                   "compile_time_s": 0.1, "wall_time_s": 0.2}})


def seed(server: LiveServer) -> None:
    now = dt.datetime.now(dt.UTC)
    lines = [record(AGED, now - dt.timedelta(days=30), "aged"), record(FRESH, now, "fresh")]
    server.call("POST", "/api/v1/records", content="\n".join(lines))
    db = Database(server.settings.resolved_database_url)
    try:
        with db.session() as session:
            # what an older deployment left: a previous template version, and a target whose
            # machines are gone (both written directly; the API refuses to import them)
            session.add(TuningLogEntry(
                workload_key=OLD_TEMPLATE, op="dense", target=LLVM, template="dense.x86",
                template_version=0, config=config_json(OLD_TEMPLATE), mean_cost=1e-5,
                gflops=0.8, device_key=None))
            session.add(TuningLogEntry(
                workload_key=ORPHAN, op="dense", target=ICELAKE, template="dense.x86",
                template_version=1, config=config_json(ORPHAN), mean_cost=1e-5, gflops=2.7,
                device_key="icelake", updated_at=now - dt.timedelta(days=90)))
    finally:
        db.dispose()


def online(server: LiveServer, count: int) -> bool:
    return sum(w["online"] for w in server.call("GET", "/api/v1/workers")) >= count


def test_refresh_tunes_what_is_stale_and_exports_the_log(
        live_server: LiveServer, worker_processes: WorkerProcesses, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    seed(live_server)
    worker_processes.start(live_server.url, "epyc", LLVM, "--backend", "fake")
    worker_processes.start(live_server.url, "zen4", ZEN4, "--backend", "fake")
    wait_until(lambda: online(live_server, 2), 60, "two workers online")
    out = tmp_path / "export"

    code = main(["refresh", "--server", live_server.url, "--token", "ops-admin-token-"
                 "0123456789abcdef", "--older-than", "7", "--budget", "3", "--export", str(out),
                 "--poll-s", "0.2", "--timeout-s", "240"])
    printed = capsys.readouterr().out
    assert code == 0, printed + worker_processes.log(0) + worker_processes.log(1)
    # the seeded entries predate device classes (class ``unknown``): they serve no class, so
    # every workload is missing for the class of the workers online on each target
    assert "stale entries (window 7 days): 8 (8 missing)" in printed

    report = json.loads((out / "refresh-report.json").read_text())
    reasons = {(i["workload"], i["target"]): i["reason"] for i in report["refreshed"]}
    assert reasons == {(w, t): "missing" for w in (AGED, OLD_TEMPLATE, FRESH, ORPHAN)
                       for t in (LLVM, ZEN4)}
    assert {i["device_class"] for i in report["refreshed"]} == {FAKE_DEVICE_CLASS}
    assert [(i["workload"], i["target"]) for i in report["skipped"]] == [(ORPHAN, ICELAKE)]
    assert all(i["gflops_after"] and i["gflops_after"] > 0 for i in report["refreshed"])
    assert sorted(j["status"] for j in report["jobs"]) == ["done"] * 2
    assert {(j["target"], j["device_key"]) for j in report["jobs"]} == {
        (LLVM, "epyc"), (ZEN4, "zen4")}

    log = json.loads((out / "tuning-log.json").read_text())
    assert len(log) == 12  # the 4 seeded entries, plus 4 workloads on llvm and on znver4
    by_key = {(e["workload"], e["target"]): e for e in log
              if e["device_class"] == FAKE_DEVICE_CLASS}
    assert len(by_key) == 8
    assert by_key[(OLD_TEMPLATE, LLVM)]["template_version"] == 1
    assert by_key[(OLD_TEMPLATE, LLVM)]["measurement_id"] is not None
    lines = (out / "tuning-log.autotvm.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert sorted((r["input"][2][0], r["input"][0]) for r in records) == sorted(
        (e["workload"], e["target"]) for e in log)
    assert all(r["result"][1] == 0 and r["config"]["entity"] for r in records)

    # refreshed entries are fresh now: the next night has nothing to do but the orphan
    again = live_server.call("GET", "/api/v1/tuning-log/stale", params={"older_than_days": 7})
    assert again["items"] == []
    assert [i["target"] for i in again["skipped"]] == [ICELAKE]


def test_a_dry_run_submits_nothing(live_server: LiveServer, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    seed(live_server)
    code = main(["refresh", "--server", live_server.url, "--older-than", "7", "--dry-run",
                 "--export", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    assert code == 0
    # no worker is online: everything stale is reported as skipped, nothing submitted
    assert "stale entries (window 7 days): 0 (none)" in printed
    assert "skipped (cannot be tuned now): 3" in printed
    assert live_server.call("GET", "/api/v1/jobs") == []
    assert len(json.loads((tmp_path / "out" / "tuning-log.json").read_text())) == 4


def test_refresh_arguments_are_checked() -> None:
    parser = build_parser()
    args = parser.parse_args(["refresh", "--server", "http://x", "--older-than", "1.5",
                              "--budget", "8", "--export", "out"])
    assert (args.older_than, args.budget, args.export) == (1.5, 8, "out")
    for bad in (["--budget", "0"], ["--older-than", "-1"], ["--budget", "many"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["refresh", *bad])
