"""``tuner refresh``: tune again what is stale in the shared log, then export the log.

Asks the server which entries are stale (``GET /tuning-log/stale``: older template, not measured
within ``--older-than`` days, or missing on a target that now has online workers), submits them
as workload jobs (one per target and device), prints progress lines until they end, and writes
the refreshed log to ``--export DIR``:

* ``tuning-log.json``: every best config of the shared log (``GET /tuning-log``);
* ``tuning-log.autotvm.jsonl``: the same as AutoTVM-style JSON lines;
* ``refresh-report.json``: what was stale and why, the jobs, and GFLOPS before and after.

Exit status: 0 when every job finished (or nothing was stale), 1 otherwise. Runs over HTTP only
(httpx), like ``tuner submit``; the nightly CI workflow calls it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tuner_service.cli.client import ClientError, ServiceClient, with_client
from tuner_service.db.states import JOB_FINAL, JobStatus, TaskStatus

#: the most workloads one job takes (the API's limit)
MAX_WORKLOADS_PER_JOB = 10_000


def _refresh(args: argparse.Namespace) -> int:
    return with_client(args, lambda client: run_refresh(client, args))


def run_refresh(client: ServiceClient, args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"older_than_days": args.older_than}
    if args.target:
        params["target"] = args.target
    if args.max_entries:
        params["limit"] = args.max_entries
    report: dict[str, Any] = client.request("GET", "/tuning-log/stale", params=params)
    _print_stale(report)
    jobs: list[dict[str, Any]] = []
    failed = 0
    if report["items"] and not args.dry_run:
        jobs, failed = _submit(client, report["items"], args)
        final = _wait(client, [j["job_id"] for j in jobs], args.poll_s, args.timeout_s)
        for job in jobs:
            job["final"] = final.get(job["job_id"])
    if args.export:
        _export(client, Path(args.export), report, jobs, args)
    unfinished = [j for j in jobs if (j.get("final") or {}).get("status") != JobStatus.DONE]
    for job in unfinished:
        status = (job.get("final") or {}).get("status", "unknown")
        print(f"job {job['job_id']} ({job['target']}) ended {status}", file=sys.stderr)
    return 1 if unfinished or failed else 0


def _print_stale(report: dict[str, Any]) -> None:
    items, skipped = report["items"], report["skipped"]
    reasons = Counter(i["reason"] for i in items)
    summary = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items())) or "none"
    print(f"stale entries (window {report['older_than_days']:g} days): {len(items)} ({summary})")
    for item in items:
        print(f"  {item['reason']:<8} {item['target']:<20} {item['workload']}: {item['detail']}")
    if skipped:
        print(f"skipped (cannot be tuned now): {len(skipped)}")
        for item in skipped:
            print(f"  {item['reason']:<8} {item['target']:<20} {item['workload']}: "
                  f"{item['detail']}")


def _submit(client: ServiceClient, items: list[dict[str, Any]], args: argparse.Namespace
            ) -> tuple[list[dict[str, Any]], int]:
    """One job per (target, device key, threads); returns the jobs and how many submissions
    failed (the device key picks a worker of the device class an item refreshes)."""
    groups: dict[tuple[str, str | None, int | None], list[str]] = {}
    for item in items:
        groups.setdefault((item["target"], item["device_key"], item.get("threads")),
                          []).append(item["workload"])
    jobs, failed = [], 0
    for (target, device_key, threads), workloads in sorted(
            groups.items(), key=lambda g: (g[0][0], g[0][1] or "", g[0][2] or 0)):
        for start in range(0, len(workloads), MAX_WORKLOADS_PER_JOB):
            chunk = workloads[start:start + MAX_WORKLOADS_PER_JOB]
            try:
                job_id = client.create_job(workloads=chunk, target=target, device_key=device_key,
                                           trials_per_task=args.budget, tuner=args.tuner,
                                           **({"threads": threads} if threads else {}))
            except ClientError as e:
                print(f"error: cannot submit {len(chunk)} workloads for {target}: {e}",
                      file=sys.stderr)
                failed += 1
                continue
            where = f"{target}" + (f" on {device_key}" if device_key else "")
            print(f"job {job_id}: {len(chunk)} workloads, {args.budget} trials each, {where}")
            jobs.append({"job_id": job_id, "target": target, "device_key": device_key,
                         "workloads": chunk})
    return jobs, failed


def _wait(client: ServiceClient, job_ids: list[int], poll_s: float, timeout_s: float
          ) -> dict[int, dict[str, Any]]:
    """Poll until every job ends, one progress line per change; cancel them on timeout."""
    deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
    status: dict[int, dict[str, Any]] = {}
    shown: dict[int, str] = {}
    while True:
        for job_id in job_ids:
            if status.get(job_id, {}).get("status") in JOB_FINAL:
                continue
            status[job_id] = client.job(job_id)
            line = _progress_line(status[job_id])
            if shown.get(job_id) != line:
                print(line, flush=True)
                shown[job_id] = line
        if all(status[j]["status"] in JOB_FINAL for j in job_ids):
            return status
        if deadline is not None and time.monotonic() > deadline:
            break
        time.sleep(poll_s)
    for job_id in job_ids:
        if status[job_id]["status"] not in JOB_FINAL:
            print(f"job {job_id}: timed out after {timeout_s:g} s; cancelling", file=sys.stderr)
            status[job_id] = client.request("POST", f"/jobs/{job_id}/cancel")
    return status


def _progress_line(job: dict[str, Any]) -> str:
    tasks = job["tasks"]
    done = sum(t["trials_done"] for t in tasks)
    budget = sum(t["trials_budget"] for t in tasks)
    finished = sum(t["status"] in (TaskStatus.DONE, TaskStatus.SKIPPED) for t in tasks)
    return (f"job {job['job_id']} [{job['target']}] {job['status']}: {finished}/{len(tasks)} "
            f"tasks, {done}/{budget} trials")


def _export(client: ServiceClient, out: Path, report: dict[str, Any],
            jobs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    out.mkdir(parents=True, exist_ok=True)
    params = {"target": args.target} if args.target else {}
    log: list[dict[str, Any]] = client.request("GET", "/tuning-log",
                                               params={**params, "limit": 100_000})
    (out / "tuning-log.json").write_text(json.dumps(log, indent=2) + "\n")
    lines = client.request("GET", "/tuning-log/autotvm", params=params)
    (out / "tuning-log.autotvm.jsonl").write_text(lines if isinstance(lines, str) else "")
    # the entry each item refreshed: its device class and thread count on that target
    after = {(e["workload"], e["target"], e.get("device_class"), e.get("threads")): e
             for e in log}
    refreshed = []
    for item in report["items"]:
        entry = after.get((item["workload"], item["target"], item.get("device_class"),
                           item.get("threads")))
        refreshed.append({**item, "gflops_before": item["gflops"],
                          "gflops_after": entry["gflops"] if entry else None,
                          "template_after": entry["template"] if entry else None,
                          "template_version_after": entry["template_version"] if entry else None})
    summary = {
        "server": client.server, "checked_at": report["checked_at"],
        "older_than_days": report["older_than_days"], "budget": args.budget,
        "tuner": args.tuner, "dry_run": args.dry_run, "refreshed": refreshed,
        "skipped": report["skipped"],
        "jobs": [{"job_id": j["job_id"], "target": j["target"], "device_key": j["device_key"],
                  "status": (j.get("final") or {}).get("status"),
                  "tasks": (j.get("final") or {}).get("tasks", [])} for j in jobs],
    }
    (out / "refresh-report.json").write_text(json.dumps(summary, indent=2) + "\n")
    for item in refreshed:
        before, now = item["gflops_before"], item["gflops_after"]
        print(f"  {item['target']:<20} {item['workload']}: "
              f"{_gflops(before)} -> {_gflops(now)} GFLOPS")
    print(f"exported {len(log)} entries to {out}/ (tuning-log.json, tuning-log.autotvm.jsonl, "
          "refresh-report.json)")


def _gflops(value: float | None) -> str:
    return f"{value:.1f}" if value else "-"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "refresh", help="tune again what is stale in the shared log; export the log",
        description=__doc__.splitlines()[0])
    parser.add_argument("--server", help="server URL (default: TUNER_SERVER_URL or saved)")
    parser.add_argument("--token", help="a user or admin token (default: TUNER_TOKEN or saved)")
    parser.add_argument("--older-than", type=_at_least(0.0, float), default=7.0, metavar="DAYS",
                        help="re-tune entries not measured within DAYS days (default 7)")
    parser.add_argument("--budget", type=_at_least(1, int), default=32, metavar="N",
                        help="trials per stale workload (default 32)")
    parser.add_argument("--tuner", default="xgb-transfer",
                        help="search strategy (default: xgb-transfer)")
    parser.add_argument("--target", default=None, help="only entries of this target")
    parser.add_argument("--max-entries", type=_at_least(0, int), default=0, metavar="N",
                        help="tune at most N entries this run (default: all)")
    parser.add_argument("--export", default=None, metavar="DIR",
                        help="write the refreshed log (JSON, AutoTVM lines) and a report here")
    parser.add_argument("--dry-run", action="store_true",
                        help="only list what is stale (and export the log as it is)")
    parser.add_argument("--poll-s", type=_at_least(0.05, float), default=5.0,
                        help="progress poll interval (default 5 s)")
    parser.add_argument("--timeout-s", type=_at_least(0.0, float), default=0.0, metavar="S",
                        help="cancel the jobs after S seconds (default: wait for ever)")
    parser.set_defaults(func=_refresh)


def _at_least(low: float, kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low:g}, got {text}")
        return value

    return parse
