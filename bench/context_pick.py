"""Would a job pick other configs if it timed them as the model runs them (#18, "tune in context")?

A job ranks a task's configs by runs that repeat the layer with its weights in cache; inside a
model the weights come from memory. This reads a finished job's trials back from its database,
takes each task's ``--top`` fastest configs plus the template default, and times every one of
them both ways, interleaved over ``--rounds``: warm as the job did, and after a cache flush
(``weights_cold.measure``: ``MeasureOptions(flush_cache=True)``). It prints JSON per task: each
candidate's warm and flushed median ms, the warm pick, the flushed pick and what choosing by warm
time costs in flushed time. With ``--write DIR`` it writes ``warm.json`` and ``flushed.json``
(``tuner build --configs``), the two picks per task, so that both builds can be timed in the
model (``bench/paired.py``): whether the flushed pick helps is decided there, not here.

    python bench/e2e_tune.py MODEL.onnx --name NAME --threads 1 --trials 32
    python bench/context_pick.py bench/.e2e-cache/tuning-t1/tuner.db --threads 1 --write /tmp/ctx
    tuner build MODEL.onnx -o /tmp/warm --configs /tmp/ctx/warm.json
    tuner build MODEL.onnx -o /tmp/flushed --configs /tmp/ctx/flushed.json
    python bench/paired.py MODEL.onnx /tmp/warm /tmp/flushed --threads 1 --rounds 30
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from schedule_templates.templates.base import get_template
from schedule_templates.workloads import parse_workload
from workers.hardware import cpu_facts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from job_convergence import read_trials
from weights_cold import measure


def find_job(db: Path, job: int | None) -> tuple[int, int | None]:
    """Job ``job`` (the newest when None) in ``db`` and its thread count."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from tuner_service.db.engine import make_engine
    from tuner_service.db.models import Job

    engine = make_engine(f"sqlite:///{db.resolve()}")
    try:
        with Session(engine) as session:
            query = select(Job.id, Job.threads)
            query = query.where(Job.id == job) if job is not None else query
            row = session.execute(query.order_by(Job.id.desc()).limit(1)).first()
    finally:
        engine.dispose()
    if row is None:
        raise SystemExit(f"context_pick: no job {job if job is not None else ''} in {db}")
    return int(row[0]), row[1]


def job_tasks(db: Path, job_id: int, top: int) -> list[dict[str, Any]]:
    """Per task of the job: workload, template and the ``top`` fastest distinct configs its
    trials measured (``job_convergence.read_trials``: re-measurements left out)."""
    trials = read_trials(db, job_id, dt.datetime.now(dt.UTC))
    by_task: dict[int, dict[str, tuple[float, dict[str, Any]]]] = {}
    keys: dict[int, tuple[str, str]] = {}
    for trial in trials:
        keys[trial.job_task_id] = (trial.workload, trial.template)
        if trial.cost is None:
            continue
        seen = by_task.setdefault(trial.job_task_id, {})
        canonical = json.dumps(trial.config, sort_keys=True)
        if canonical not in seen or trial.cost < seen[canonical][0]:
            seen[canonical] = (trial.cost, trial.config)
    return [{"workload": keys[task][0], "template": keys[task][1],
             "configs": [config for _cost, config in sorted(
                 by_task.get(task, {}).values(), key=lambda cc: cc[0])[:top]]}
            for task in sorted(keys)]


def time_both(key: str, configs: list[dict[str, Any]], threads: int, rounds: int
              ) -> list[dict[str, Any]]:
    """Each config's median warm and flushed ms over ``rounds`` interleaved passes."""
    samples: list[dict[str, list[float]]] = [{"warm_ms": [], "flushed_ms": []} for _ in configs]
    errors: dict[int, str] = {}
    for _round in range(rounds):
        for i, config in enumerate(configs):
            if i in errors:
                continue
            row = measure(key, threads, config)
            if "flushed_ms" not in row:
                errors[i] = str(row.get("warm_error") or row.get("flushed_error"))
                continue
            for name, times in samples[i].items():
                times.append(row[name])
    return [{"config": config, "error": errors[i]} if i in errors else
            {"config": config, **{name: round(statistics.median(times), 4)
                                  for name, times in samples[i].items()}}
            for i, config in enumerate(configs)]


def pick(task: dict[str, Any], threads: int, rounds: int) -> dict[str, Any]:
    workload = parse_workload(task["workload"])
    template = get_template(workload.op)
    default = template.default_config(workload).to_json()
    configs = [default, *[c for c in task["configs"] if c != default]]
    timed = time_both(task["workload"], configs, threads, rounds)
    ok = [t for t in timed if "warm_ms" in t]
    row: dict[str, Any] = {"workload": task["workload"], "template": template.name,
                           "candidates": timed}
    if not ok:
        return row
    warm = min(ok, key=lambda t: t["warm_ms"])
    cold = min(ok, key=lambda t: t["flushed_ms"])
    row.update({"warm_pick": warm, "flushed_pick": cold, "same_pick": warm is cold,
                "default_flushed_ms": ok[0]["flushed_ms"] if ok[0]["config"] == default
                else None,
                "warm_pick_regret_ms": round(warm["flushed_ms"] - cold["flushed_ms"], 4)})
    return row


def configs_file(rows: list[dict[str, Any]], which: str, threads: int) -> dict[str, Any]:
    """The ``tuner fetch`` document of one pick per task."""
    return {"threads": threads, "tasks": [
        {"workload": r["workload"], "template": r["template"],
         "template_version": int(get_template(parse_workload(r["workload"]).op).version),
         "config": r[which]["config"],
         "best_latency_s": r[which]["flushed_ms" if which == "flushed_pick" else "warm_ms"] / 1e3}
        for r in rows if which in r]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("db", type=Path, help="a job's SQLite database (tuner.db)")
    parser.add_argument("--job", type=int, help="job id (default: the latest)")
    parser.add_argument("--threads", type=int, help="default: the job's")
    parser.add_argument("--top", type=int, default=3, help="fastest configs per task")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--match", default="", help="only tasks whose workload key has this")
    parser.add_argument("--write", type=Path, help="write warm.json and flushed.json here")
    args = parser.parse_args(argv)
    if not args.db.is_file():
        parser.error(f"no database at {args.db}")
    job_id, job_threads = find_job(args.db, args.job)
    tasks = [t for t in job_tasks(args.db, job_id, args.top) if args.match in t["workload"]]
    threads = args.threads or job_threads or 1
    rows = [pick(task, threads, args.rounds) for task in tasks]
    decided = [r for r in rows if "warm_pick" in r]
    report = {
        "cpu": cpu_facts()["cpu_model"], "job": job_id, "threads": threads,
        "top": args.top, "rounds": args.rounds, "tasks": len(rows),
        "different_picks": sum(not r["same_pick"] for r in decided),
        "warm_pick_regret_ms": round(sum(r["warm_pick_regret_ms"] for r in decided), 4),
        "flushed_ms_warm_picks": round(sum(r["warm_pick"]["flushed_ms"] for r in decided), 4),
        "rows": rows,
    }
    if args.write:
        args.write.mkdir(parents=True, exist_ok=True)
        for name, which in (("warm.json", "warm_pick"), ("flushed.json", "flushed_pick")):
            (args.write / name).write_text(json.dumps(configs_file(decided, which, threads),
                                                      indent=1))
    json.dump(report, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
