"""How the kernels' libgomp threads should wait between layers: one model at 2 threads under
libgomp's default (spin, then sleep), OMP_WAIT_POLICY=passive (sleep at once) and
GOMP_SPINCOUNT=10000 / 100000 (shorter spins), each run a fresh ``tuner run`` process (libgomp
reads the policy once, when it loads), repeated in rotating order so that a change of load
touches every policy alike.

    python bench/omp_policy.py [--model squeezenet1_1] [--threads 2] [--repeats 5]
                               [--iterations 20] [--library DIR]

Prints JSON: per policy, the median latency of every run and their median and minimum. The
runtime's own choice is ``WAIT_POLICY`` in ``tuner_service/compiler/deploy/loader.py`` (a user's own
OMP_WAIT_POLICY / GOMP_SPINCOUNT wins); this measures what to set it to. Spinning helps only
when every thread has a core to itself: run it both on an idle and on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from e2e_models import ALL_MODELS, ModelUnavailable, model_file  # noqa: E402
from zoo import ZOO_PYTHON, build, call, tuner_command  # noqa: E402

logger = logging.getLogger("omp_policy")

#: policy name -> the variables its runs get (the default: neither variable set)
POLICIES: dict[str, dict[str, str]] = {
    "default": {},
    "passive": {"OMP_WAIT_POLICY": "passive"},
    "spin10000": {"GOMP_SPINCOUNT": "10000"},
    "spin100000": {"GOMP_SPINCOUNT": "100000"},
}
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def policy_env(policy: str, base: dict[str, str]) -> dict[str, str]:
    """``base`` without any wait setting of its own, plus the policy's."""
    env = {k: v for k, v in base.items() if k not in WAIT_VARIABLES}
    return {**env, **POLICIES[policy]}


def rotation(names: list[str], round_number: int) -> list[str]:
    shift = round_number % len(names)
    return names[shift:] + names[:shift]


def run_once(model: Path, library: Path, threads: int, iterations: int, policy: str
             ) -> dict[str, Any]:
    command = [*tuner_command(), "run", str(model), "--library", str(library), "--threads",
               str(threads), "--iterations", str(iterations), "--warmup", "2", "--json"]
    data, error, _ = call(command, "run", policy_env(policy, dict(os.environ)))
    if data is None:
        return {"error": error}
    return {"ms": data["latency_ms"]["median"]}


def measure(model: Path, library: Path, args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in POLICIES}
    for number in range(args.repeats):
        for policy in rotation(list(POLICIES), number):
            runs[policy].append(run_once(model, library, args.threads, args.iterations, policy))
            logger.info("round %d %s: %s", number + 1, policy, runs[policy][-1])
    out = {}
    for policy, results in runs.items():
        values = sorted(r["ms"] for r in results if "ms" in r)
        out[policy] = {"env": POLICIES[policy], "medians_ms": [r.get("ms") for r in results],
                       "median_ms": statistics.median(values) if values else None,
                       "min_ms": values[0] if values else None,
                       "errors": [r["error"] for r in results if "error" in r]}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="squeezenet1_1", choices=ALL_MODELS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=20, help="runs per process")
    parser.add_argument("--library", type=Path, help="a built library (default: build one "
                        "with default configs)")
    parser.add_argument("--zoo-python", type=Path, default=ZOO_PYTHON)
    args = parser.parse_args()
    if min(args.threads, args.repeats, args.iterations) < 1:
        parser.error("--threads, --repeats and --iterations must be at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    try:
        model = model_file(args.model, args.zoo_python)
    except ModelUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    start = list(os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="omp-policy-") as tmp:
        library = args.library or Path(tmp) / "lib"
        if args.library is None:
            built = build(str(model.path), library)
            if "error" in built:
                print(f"error: tuner build failed: {built['error']}", file=sys.stderr)
                return 1
        policies = measure(model.path, library, args)
    print(json.dumps({"model": args.model, "threads": args.threads, "repeats": args.repeats,
                      "iterations": args.iterations, "cpu_count": os.cpu_count(),
                      "load_average_start": start, "load_average_end": list(os.getloadavg()),
                      "policies": policies}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
