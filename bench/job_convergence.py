"""How a real ResNet-18 tuning job's model latency converges over wall time (issue #20: within
10% of the best latency we know in under 20 minutes).

One job runs the path ``tuner tune MODEL.onnx`` takes (``tuning/model_job.py``: embedded SQLite
server, one local worker, the job driver; ``xgb-transfer``, every core, the default layout) in a
fresh output directory. Afterwards every finished trial is read back from the job's database
with its ``finished_at`` (database clock, UTC, milliseconds), and for each snapshot time the
fastest successful trial per task so far becomes a configs file (``end``: all of them). The
job's own ``configs.json`` is one more snapshot: it holds the winners of the job's
re-measurement of its top candidates, which keeps a task's default config when the machine was
busy meanwhile. Each snapshot and the default build are then built with ``tuner build`` and
timed with ``tuner run`` back to back once the job is over, ``--repeats`` rounds interleaved,
each run after the machine went quiet (within a budget); the min of the medians counts. Time 0
is this script calling ``tune_model`` (upload, task extraction and worker start included), as a
user of ``tuner tune`` would count it.

    python bench/job_convergence.py [--trials 64] [--snapshots 2.5,5,10,15,20] [-o DIR]
                                    [--stop-after-min M] [--from DIR]

``--stop-after-min`` interrupts the job (it stays resumable in its database) and measures the
snapshots it reached; ``--from DIR`` skips tuning and measures the snapshots of a job already
in DIR. Prints one JSON object.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see tuner_service/cli/main.py

import argparse
import dataclasses
import datetime as dt
import hashlib
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from e2e_models import model_file  # noqa: E402
from zoo import ZOO_PYTHON, build, run_ours  # noqa: E402

from schedule_templates.records import ErrorKind  # noqa: E402
from tuner_service.tuning.embedded import LocalWorkers  # noqa: E402
from tuner_service.tuning.model_job import CONFIGS_FILE, TuneOptions, tune_model  # noqa: E402
from tuner_service.tuning.remote import Job, JobProgress  # noqa: E402

MODEL = "resnet18"
TUNER = "xgb-transfer"
SNAPSHOTS_MIN = (2.5, 5.0, 10.0, 15.0, 20.0)
TARGET_S = 20 * 60.0
WITHIN = 0.10
START_FILE = "convergence-start.json"
#: written into a library folder once ``tuner build`` succeeded there (its summary)
BUILT_FILE = "convergence-build.json"
logger = logging.getLogger("job_convergence")


class JobStopped(Exception):
    """Raised from the progress callback to interrupt the job at ``--stop-after-min``."""


@dataclasses.dataclass(frozen=True)
class Trial:
    """One finished trial of the job (re-measurements excluded)."""

    job_task_id: int
    workload: str
    template: str
    template_version: int
    config: dict[str, Any]
    #: seconds after time 0 at which its result was stored
    t_s: float
    #: mean latency in seconds, None for a failed trial
    cost: float | None


@dataclasses.dataclass(frozen=True)
class Snapshot:
    name: str
    t_s: float
    trials: int
    configs: Path


# --- the job -----------------------------------------------------------------------------


def run_job(path: Path, output: Path, trials: int, threads: int,
            stop_after_s: float | None) -> dict[str, Any]:
    """Tune ``path`` into ``output``; returns the job's id, time 0 and outcome."""
    options = TuneOptions(trials_per_task=trials, tuner=TUNER, threads=threads,
                          workers=LocalWorkers(count=1, threads=threads,
                                               parallel_build=os.cpu_count() or 1))
    output.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.UTC)
    clock = time.perf_counter()
    job_ids: list[int] = []

    def on_start(url: str, job: Job, origin: str) -> None:
        job_ids.append(job.id)
        logger.info("job %d (%s) on %s", job.id, origin, url)
        write_start(output, started, job.id)

    def on_progress(progress: JobProgress) -> None:
        if stop_after_s is not None and time.perf_counter() - clock > stop_after_s:
            raise JobStopped(f"stopped after {stop_after_s:.0f} s "
                             f"({progress.trials_done}/{progress.trials_budget} trials)")

    try:
        result = tune_model(path, output, options, on_start, on_progress)
        status = str(result.progress.status)
    except JobStopped as e:
        logger.info("%s", e)
        status = "stopped"
    return {"job_id": job_ids[0], "started": started, "status": status,
            "wall_s": round(time.perf_counter() - clock, 1)}


def write_start(output: Path, started: dt.datetime, job_id: int) -> None:
    (output / START_FILE).write_text(json.dumps({"started": started.isoformat(),
                                                 "job_id": job_id}) + "\n")


def read_start(output: Path) -> tuple[dt.datetime, int]:
    data = json.loads((output / START_FILE).read_text())
    return dt.datetime.fromisoformat(data["started"]), int(data["job_id"])


# --- the job's database ------------------------------------------------------------------


def read_trials(database: Path, job_id: int, started: dt.datetime) -> list[Trial]:
    """Every finished trial of ``job_id``, in the order their results were stored."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from tuner_service.db.engine import make_engine
    from tuner_service.db.models import JobTask, Measurement
    from tuner_service.db.states import MeasurementState

    engine = make_engine(f"sqlite:///{database.resolve()}")
    try:
        with Session(engine) as session:
            rows = session.scalars(
                select(Measurement).join(JobTask, JobTask.id == Measurement.job_task_id)
                .where(JobTask.job_id == job_id, Measurement.state == MeasurementState.DONE,
                       Measurement.purpose != "confirm")
                .order_by(Measurement.finished_at, Measurement.id)).all()
            return [trial_of(m, started) for m in rows]
    finally:
        engine.dispose()


def job_end_s(database: Path, job_id: int, started: dt.datetime) -> float:
    """When ``job_id`` finished (or last stored a result), in seconds after time 0."""
    from sqlalchemy import func, select
    from sqlalchemy.orm import Session

    from tuner_service.db.engine import make_engine
    from tuner_service.db.models import Job, JobTask, Measurement

    engine = make_engine(f"sqlite:///{database.resolve()}")
    try:
        with Session(engine) as session:
            end = session.scalar(select(Job.finished_at).where(Job.id == job_id)) or \
                session.scalar(select(func.max(Measurement.finished_at))
                               .join(JobTask, JobTask.id == Measurement.job_task_id)
                               .where(JobTask.job_id == job_id))
    finally:
        engine.dispose()
    return (end - started).total_seconds() if end is not None else 0.0


def trial_of(m: Any, started: dt.datetime) -> Trial:
    ok = m.error_kind is ErrorKind.NONE and m.mean_cost
    return Trial(int(m.job_task_id), m.workload_key, m.template, m.template_version,
                 dict(m.config), (m.finished_at - started).total_seconds(),
                 float(m.mean_cost) if ok else None)


def best_by(trials: list[Trial], t_s: float) -> dict[int, Trial]:
    """The fastest successful trial of each task among those stored by ``t_s``."""
    best: dict[int, Trial] = {}
    for trial in trials:
        if trial.t_s > t_s or trial.cost is None:
            continue
        known = best.get(trial.job_task_id)
        if known is None or known.cost is None or trial.cost < known.cost:
            best[trial.job_task_id] = trial
    return best


def configs_document(best: dict[int, Trial], job_id: int, threads: int) -> dict[str, Any]:
    """A ``tuner fetch`` style document (what ``tuner build --configs`` reads)."""
    tasks = [{"workload": t.workload, "template": t.template,
              "template_version": t.template_version, "config": t.config,
              "best_latency_s": t.cost} for _, t in sorted(best.items())]
    return {"job_id": job_id, "target": "llvm", "threads": threads, "tasks": tasks}


def snapshots(trials: list[Trial], times_s: list[float], end_s: float, job_id: int,
              threads: int, folder: Path) -> list[Snapshot]:
    """One configs file per snapshot time the job reached, and one at its end."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for t_s in [*sorted(t for t in times_s if t < end_s), end_s]:
        name = "end" if t_s == end_s else f"{t_s / 60:g} min"
        path = folder / f"configs-{'end' if t_s == end_s else f'{t_s:g}s'}.json"
        path.write_text(json.dumps(configs_document(best_by(trials, t_s), job_id, threads),
                                   indent=1) + "\n")
        out.append(Snapshot(name, t_s, sum(t.t_s <= t_s for t in trials), path))
    return out


# --- builds and timings ------------------------------------------------------------------


def build_all(model: Path, items: dict[str, Path | None], folder: Path, threads: int
              ) -> dict[str, dict[str, Any]]:
    """Build each configs file (None: the defaults) once; equal files share a library, and a
    library this script built before from the same file (``--from``) is used again."""
    out: dict[str, dict[str, Any]] = {}
    for name, configs in items.items():
        digest = hashlib.sha256((configs.read_bytes() if configs else b"")
                                + f"threads={threads}".encode()).hexdigest()[:12]
        library = folder / f"lib-{digest}"
        first = next((k for k, v in out.items() if v["library"] == str(library)), None)
        if first is not None:
            out[name] = {"library": str(library), "same_as": first}
            continue
        done = library / BUILT_FILE
        if done.exists():
            out[name] = {**json.loads(done.read_text()), "reused": True}
            continue
        logger.info("building %s", name)
        out[name] = {**build(str(model), library, configs, threads), "library": str(library)}
        if "error" not in out[name]:
            done.write_text(json.dumps(out[name]) + "\n")
    return out


def busy_cores(window_s: float = 2.0) -> float:
    """Cores kept busy by anything on the machine over ``window_s`` (from /proc/stat)."""
    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields[:8]) - idle, sum(fields[:8])

    busy0, total0 = sample()
    time.sleep(window_s)
    busy1, total1 = sample()
    cores = os.cpu_count() or 1
    return round(cores * (busy1 - busy0) / max(total1 - total0, 1), 2)


@dataclasses.dataclass
class Quiet:
    """Waits before each timed run until the machine is quiet, within one budget in all."""

    max_busy: float
    budget_s: float
    #: busy cores seen just before each timed run
    seen: list[float] = dataclasses.field(default_factory=list)

    def wait(self) -> None:
        busy = busy_cores()
        while busy > self.max_busy and self.budget_s > 0:
            started = time.perf_counter()
            time.sleep(5.0)
            busy = busy_cores()
            self.budget_s -= time.perf_counter() - started
        self.seen.append(busy)


def time_all(model: Path, libraries: dict[str, dict[str, Any]], threads: int, iterations: int,
             repeats: int, quiet: Quiet) -> dict[str, list[float]]:
    """Each library's median latency (ms) in each of ``repeats`` interleaved rounds; a
    snapshot whose configs equal another's shares its figures."""
    own = [name for name, built in libraries.items()
           if "same_as" not in built and "error" not in built]
    medians: dict[str, list[float]] = {name: [] for name in own}
    for _ in range(repeats):
        for name in own:
            quiet.wait()
            ran = run_ours(str(model), Path(libraries[name]["library"]), threads, iterations)
            if "ms" in ran:
                medians[name].append(float(ran["ms"]))
            else:
                logger.warning("%s: %s", name, ran.get("error"))
    return {name: medians.get(built.get("same_as", name), [])
            for name, built in libraries.items()}


# --- report ------------------------------------------------------------------------------


def cpu() -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "cpu family", "model") and key not in fields:
            fields[key] = value.strip()
    try:
        import llvmlite.binding as llvm

        fields["llvm_host_cpu"] = llvm.get_host_cpu_name()
    except ImportError:
        pass
    return {**fields, "cores": os.cpu_count()}


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def snapshot_row(snap: Snapshot, runs: list[float], best: float | None) -> dict[str, Any]:
    ms = round(min(runs), 3) if runs else None
    ratio = round(ms / best, 3) if ms is not None and best else None
    return {"snapshot": snap.name, "t_s": round(snap.t_s, 1), "trials_so_far": snap.trials,
            "latency_ms": ms, "ratio_to_best": ratio,
            "medians_ms": [round(x, 2) for x in runs]}


def report(snaps: list[Snapshot], runs: dict[str, list[float]], job: dict[str, Any],
           trials: list[Trial], args: argparse.Namespace) -> dict[str, Any]:
    measured = [min(runs[s.name]) for s in snaps if runs.get(s.name)]
    best = round(min(measured), 3) if measured else None
    rows = [snapshot_row(s, runs.get(s.name, []), best) for s in snaps]
    default = runs.get("default", [])
    first = next((r for r in rows if r["ratio_to_best"] is not None
                  and r["ratio_to_best"] <= 1 + WITHIN), None)
    return {
        "model": MODEL, "cpu": cpu(), "threads": args.threads, "tuner": TUNER,
        "trials_cap_per_task": args.trials, "layout": "auto (default)",
        "job": {k: v for k, v in job.items() if k != "started"},
        "job_started_utc": job["started"].isoformat(timespec="seconds"),
        "trials_measured": len(trials),
        "first_trial_t_s": round(min((t.t_s for t in trials), default=0.0), 1),
        "trials_failed": sum(t.cost is None for t in trials),
        "snapshots": rows, "default_ms": round(min(default), 3) if default else None,
        "default_medians_ms": [round(x, 2) for x in default],
        "best_ms": best, "best_is": "best over this job's snapshots",
        "first_within_10pct_s": first["t_s"] if first else None,
        "first_within_10pct": first["snapshot"] if first else None,
        "target_20min_met": bool(first and first["t_s"] <= TARGET_S),
        "timing": {"iterations": args.iterations, "repeats": args.repeats,
                   "statistic": "min over repeats of tuner run's median"},
    }


# --- main --------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--trials", type=int, default=64, help="trials per task (default 64)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="threads per kernel, tuning and timing (default: all cores)")
    parser.add_argument("--snapshots", default=",".join(f"{m:g}" for m in SNAPSHOTS_MIN),
                        help="snapshot times in minutes, comma-separated (the end is added)")
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="fresh output directory (default: bench/.e2e-cache/convergence/"
                             "<UTC time>)")
    parser.add_argument("--from", dest="existing", type=Path, default=None,
                        help="measure the job already in this directory instead of tuning")
    parser.add_argument("--stop-after-min", type=float, default=None,
                        help="interrupt the job after this many minutes (it stays resumable)")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quiet-cores", type=float, default=0.3,
                        help="before each timed run, wait until at most this many cores are "
                             "busy (default 0.3) ...")
    parser.add_argument("--quiet-budget-s", type=float, default=300.0,
                        help="... waiting at most this long over all runs (default 300)")
    args = parser.parse_args(argv)
    if args.existing is None and args.output is not None and args.output.exists() \
            and any(args.output.iterdir()):
        parser.error(f"{args.output} is not empty: the job must start fresh (or use --from)")
    return args


def tune_or_read(args: argparse.Namespace, model: Path) -> tuple[Path, dict[str, Any]]:
    if args.existing is not None:
        started, job_id = read_start(args.existing)
        return args.existing, {"job_id": job_id, "started": started, "status": "read back",
                               "wall_s": None}
    output = args.output or HERE / ".e2e-cache" / "convergence" / time.strftime(
        "%Y%m%d-%H%M%S", time.gmtime())
    stop = args.stop_after_min * 60 if args.stop_after_min is not None else None
    return output, run_job(model, output, args.trials, args.threads, stop)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per progress poll
    model = model_file(MODEL, ZOO_PYTHON).path
    load_start = load()
    output, job = tune_or_read(args, model)
    load_after_job = load()
    trials = read_trials(output / "tuner.db", job["job_id"], job["started"])
    if job["wall_s"] is None:  # --from: the job's own record of its end
        job["wall_s"] = round(job_end_s(output / "tuner.db", job["job_id"], job["started"]), 1)
    end_s = job["wall_s"]
    times = [float(m) * 60 for m in args.snapshots.split(",") if m.strip()]
    snaps = snapshots(trials, times, end_s, job["job_id"], args.threads, output / "snapshots")
    if (output / CONFIGS_FILE).exists():  # the job's own pick (after its re-measurements)
        snaps.append(Snapshot("end: job's configs.json", end_s, len(trials),
                              output / CONFIGS_FILE))
    items: dict[str, Path | None] = {"default": None, **{s.name: s.configs for s in snaps}}
    libraries = build_all(model, items, output / "libraries", args.threads)
    load_before_timing = load()
    quiet = Quiet(args.quiet_cores, args.quiet_budget_s)
    latency = time_all(model, libraries, args.threads, args.iterations, args.repeats, quiet)
    result = report(snaps, latency, job, trials, args)
    result.update(output=str(output), libraries=libraries, load_average={
        "start": load_start, "after_job": load_after_job, "before_timing": load_before_timing,
        "end": load()}, busy_cores_before_each_run=quiet.seen,
        commands=commands(model, output, args))
    print(json.dumps(result, indent=1))
    return 0


def commands(model: Path, output: Path, args: argparse.Namespace) -> dict[str, str]:
    """The commands behind each figure, as a user would type them."""
    return {
        "this": "python bench/job_convergence.py " + " ".join(sys.argv[1:]),
        "tune": f"tuner tune {model} -o {output} --trials {args.trials} --threads "
                f"{args.threads} --tuner {TUNER}",
        "build": f"tuner build {model} --configs {output}/snapshots/configs-<t>s.json "
                 f"-o LIB --threads {args.threads} --json",
        "run": f"tuner run {model} --library LIB --threads {args.threads} --iterations "
               f"{args.iterations} --warmup 1 --check --json",
    }


if __name__ == "__main__":
    sys.exit(main())
