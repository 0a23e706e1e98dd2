"""Where a model's run time goes: ``tuner run --profile``.

Each step is timed alone, step by step (``ModelRunner.profile``: the median of several runs),
then summed by kind (tuned kernel, generated operator, int8 kernel or glue, numpy or reference
step) and listed slowest first, with the throughput of the steps whose work is known (a tuned
or int8 kernel's workload). Step-by-step times include each step's Python call, which the native
program does not pay, so the sum is a little above ``latency_ms``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tuner_service.compiler.deploy.executor import ModelRunner


def profile_report(runner: ModelRunner, feeds: Mapping[str, np.ndarray], iterations: int,
                   top: int = 15) -> dict[str, Any]:
    """``by_kind``: steps, milliseconds and share per kind; ``steps``: the ``top`` slowest."""
    rows = []
    for step, timed in zip(runner.steps, runner.profile(feeds, iterations), strict=True):
        workload = getattr(getattr(step, "kernel", None), "workload", None)
        seconds = float(timed["median_s"])
        gflops = (workload.flops() / seconds / 1e9 if workload is not None and seconds > 0
                  else None)
        rows.append({"step": timed["step"], "kind": timed["kind"], "ms": seconds * 1e3,
                     "gflops": gflops})
    total = sum(row["ms"] for row in rows) or 1.0
    kinds: dict[str, dict[str, Any]] = {}
    for row in rows:
        entry = kinds.setdefault(row["kind"], {"steps": 0, "ms": 0.0})
        entry["steps"] += 1
        entry["ms"] += row["ms"]
    for entry in kinds.values():
        entry["share"] = entry["ms"] / total
    slowest = sorted(rows, key=lambda row: -row["ms"])[:max(0, top)]
    return {"total_ms": total, "iterations": iterations,
            "by_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1]["ms"])),
            "steps": slowest}


def format_profile(report: Mapping[str, Any]) -> str:
    lines = [f"profile (step by step, median of {report['iterations']}): "
             f"{report['total_ms']:.3f} ms in all"]
    for kind, entry in report["by_kind"].items():
        lines.append(f"  {kind:10s} {entry['steps']:5d} steps {entry['ms']:9.3f} ms "
                     f"{100 * entry['share']:5.1f}%")
    lines.append("  slowest steps:")
    for row in report["steps"]:
        rate = f" {row['gflops']:8.1f} GFLOPS" if row["gflops"] is not None else ""
        lines.append(f"  {row['ms']:9.3f} ms {row['kind']:10s}{rate}  {row['step']}")
    return "\n".join(lines)
