"""Stored best vs template default, re-measured side by side on this machine.

For every task of a configs file (``tuner tune`` OUT/configs.json, ``tuner fetch`` JSON, a pack
from ``tuner log export``), compile the tuned config and the template default once, check both
against numpy, then time them in alternation (default, tuned, default, tuned, ...) ``--rounds``
times with the worker's quiet-machine probes. Prints JSON: per task, for each config, the median
over rounds of each run's fastest sample (``*_ms``: interference only adds time) and of each
run's median sample (``*_median_ms``), tuned / default of the former, and whether any timed run
was noisy; the summary lists tasks where the tuned config is slower than the default by more
than ``--tolerance``. Run it on an idle machine.

    python bench/best_vs_default.py --configs .tuner/quickstart/resnet18-tuned/configs.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from schedule_templates.protocol import Candidate, ClaimItem, Target
from schedule_templates.records import MeasureOptions
from schedule_templates.templates.base import template_by_name
from schedule_templates.workloads import parse_workload
from tuner_service.compiler.deploy.configs import TunedEntry, load_configs_file
from workers.backends import BackendSpec, create_backend
from workers.hardware import device_class
from workers.measure.hygiene import QuietGauge
from workers.measure.runner import compare_output


def measure_pair(entry: TunedEntry, threads: int, rounds: int, options: MeasureOptions
                 ) -> dict[str, Any]:
    workload = parse_workload(entry.workload)
    template = template_by_name(entry.template)
    tuned = template.space(workload).from_json(entry.config)
    default = template.default_config(workload)
    backend = create_backend(BackendSpec("llvm"))
    gauge = QuietGauge()
    kernels, noisy = {}, False
    fastest: dict[str, list[float]] = {"default": [], "tuned": []}
    typical: dict[str, list[float]] = {"default": [], "tuned": []}
    try:
        for name, config in (("default", default), ("tuned", tuned)):
            task = ClaimItem(name, Candidate.of(template, workload, config), Target("llvm"),
                             options, threads)
            kernel = backend.compile(task, backend.check(task))
            kernel.run()
            wrong = compare_output(kernel)
            if wrong is not None:
                raise SystemExit(f"{workload.key} {name} config {config.index}: {wrong}")
            kernels[name] = kernel
        for _round in range(rounds):
            for name, kernel in kernels.items():
                costs, seen, _attempts = gauge.measure(
                    lambda kernel=kernel: backend.run(kernel, options))
                fastest[name].append(min(costs))
                typical[name].append(statistics.median(costs))
                noisy = noisy or not seen.quiet
    finally:
        for kernel in kernels.values():
            kernel.close()
        backend.close()
    default_s, tuned_s = (statistics.median(fastest[k]) for k in ("default", "tuned"))
    return {"workload": workload.key, "threads": threads, "default_config": default.index,
            "tuned_config": tuned.index, "default_ms": default_s * 1e3,
            "tuned_ms": tuned_s * 1e3, "tuned_over_default": tuned_s / default_s,
            "default_median_ms": statistics.median(typical["default"]) * 1e3,
            "tuned_median_ms": statistics.median(typical["tuned"]) * 1e3, "noisy": noisy}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=None,
                        help="default: the thread count the configs were tuned at, else 1")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tolerance", type=float, default=0.03,
                        help="tuned may be this much slower than default before it counts")
    args = parser.parse_args(argv)
    book = load_configs_file(args.configs, "llvm")
    options = MeasureOptions(number=1, repeat=5, min_repeat_ms=100.0)
    rows = []
    for entry in sorted(book.entries(), key=lambda e: e.workload):
        threads = args.threads or entry.threads or book.threads or 1
        rows.append(measure_pair(entry, threads, args.rounds, options))
        print(json.dumps(rows[-1]), file=sys.stderr)
    slower = [r["workload"] for r in rows if r["tuned_over_default"] > 1 + args.tolerance]
    print(json.dumps({"device_class": device_class({}).id, "configs": str(args.configs),
                      "rounds": args.rounds, "tasks": rows, "slower_than_default": slower,
                      "worst_tuned_over_default": max((r["tuned_over_default"] for r in rows),
                                                      default=None)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
