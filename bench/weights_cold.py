"""Layers timed with their weights in cache and after a cache flush, default configs.

Inside a model a layer's weights come from memory (the rest of the model evicts them between
inferences), while a tuning measurement repeats the layer with them in cache. This times each
layer both ways through the worker's own runner (``MeasureOptions(flush_cache=True)`` writes
twice the last-level cache before every timed run, outside the timed region) and prints JSON:
median ms warm and flushed, their ratio, the CPU. The flushed time is close to the layer's time
inside a model (BERT-base's 128x768x3072 dense: 4.95 ms flushed, 4.90 in the model, 3.96 warm
before weight hints). Run it on a quiet machine; a flush of a 260 MB L3 takes a while.

    python bench/weights_cold.py --threads 1
    python bench/weights_cold.py --workload "dense:M=128,N=768,K=3072,epilogue=bias+residual"

``--configs N`` asks whether tuning should measure cold (the issue's "tune in context"): each
layer's default, N of its neighbours and N random configs are timed both ways, and the row
says how well the warm ranking predicts the flushed one (Spearman's rho) and what choosing by
warm time costs inside a model (``warm_pick_regret``: the flushed time of the config that is
fastest warm over the fastest flushed time, minus one).

    python bench/weights_cold.py --threads 1 --configs 12
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

import numpy as np

from schedule_templates.records import MeasureOptions
from schedule_templates.templates.base import get_template
from schedule_templates.workloads import parse_workload
from workers.hardware import cpu_facts
from workers.measure.runner import measure_candidate

#: BERT-base's and ResNet-50's heaviest layers (their weights: 2.4-9.4 MB fp32)
LAYERS = (
    "dense:M=128,N=768,K=3072,epilogue=bias+residual",
    "dense:M=128,N=3072,K=768,epilogue=bias+gelu",
    "dense:M=128,N=768,K=768,epilogue=bias",
    "conv2d:N=1,C=512,H=7,W=7,K=512,R=3,S=3,pad=1,epilogue=bias+relu",
    "conv2d:N=1,C=256,H=14,W=14,K=256,R=3,S=3,pad=1,epilogue=bias+relu",
    "conv2d_nchwc:N=1,C=2048,H=7,W=7,K=512,R=1,S=1,block=16,epilogue=bias+relu",
)
WARM = MeasureOptions(number=1, repeat=30, min_repeat_ms=20.0, check_correctness=False)
FLUSHED = MeasureOptions(number=1, repeat=15, min_repeat_ms=0.0, flush_cache=True,
                         check_correctness=False)


def measure(key: str, threads: int, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """One config (the template default unless given) warm and flushed."""
    workload = parse_workload(key)
    template = get_template(workload.op)
    if config is None:
        config = template.default_config(workload).to_json()
    row: dict[str, Any] = {"workload": key, "template": template.name}
    for name, options in (("warm", WARM), ("flushed", FLUSHED)):
        result = measure_candidate(key, template.name, config, "llvm", options, threads)
        if not result.ok:
            row[f"{name}_error"] = result.error_message
            return row
        row[f"{name}_ms"] = round(statistics.median(result.costs) * 1e3, 4)
    row["flushed_over_warm"] = round(row["flushed_ms"] / row["warm_ms"], 3)
    return row


def candidates(key: str, n: int, seed: int = 0) -> list[int]:
    """The default, up to ``n`` of its neighbours (where a tuner spends its last trials) and
    ``n`` random configs: config indices of ``key``'s space."""
    workload = parse_workload(key)
    template = get_template(workload.op)
    space = template.space(workload)
    default = int(template.default_config(workload).index)
    rng = np.random.default_rng(seed)
    near = [i for i in dict.fromkeys(space.neighbors(default)) if space.is_valid(i)]
    rng.shuffle(near)
    chosen = [default, *near[:n]]
    return chosen + space.sample(n, rng, exclude=chosen)


def ranking(key: str, threads: int, n: int) -> dict[str, Any]:
    """How the warm ranking of ``key``'s configs predicts the flushed one (``--configs``)."""
    workload = parse_workload(key)
    template = get_template(workload.op)
    space = template.space(workload)
    rows = [measure(key, threads, space.get(i).to_json()) for i in candidates(key, n)]
    timed = [r for r in rows if "flushed_ms" in r]
    out: dict[str, Any] = {"workload": key, "template": template.name, "configs": len(rows),
                           "timed": len(timed)}
    if len(timed) < 2:
        return out
    warm = np.array([r["warm_ms"] for r in timed])
    cold = np.array([r["flushed_ms"] for r in timed])
    warm_pick, cold_pick = int(np.argmin(warm)), int(np.argmin(cold))
    out.update({
        "spearman_rho": round(spearman(warm, cold), 3),
        "default_warm_ms": timed[0]["warm_ms"], "default_flushed_ms": timed[0]["flushed_ms"],
        "warm_pick": {"warm_ms": float(warm[warm_pick]), "flushed_ms": float(cold[warm_pick])},
        "flushed_pick": {"warm_ms": float(warm[cold_pick]), "flushed_ms": float(cold[cold_pick])},
        "same_pick": warm_pick == cold_pick,
        "warm_pick_regret": round(float(cold[warm_pick] / cold[cold_pick] - 1.0), 4),
    })
    return out


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (ties broken by order: times are never exactly equal)."""
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", action="append",
                        help="a workload key to time (repeatable; default: BERT-base's and "
                             "ResNet-50's heaviest layers)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--configs", type=int, default=0, metavar="N",
                        help="rank the default, N neighbours and N random configs of each "
                             "layer warm and flushed (does tuning cold change the pick?)")
    args = parser.parse_args(argv)
    if args.threads < 1 or args.configs < 0:
        parser.error("--threads must be at least 1 and --configs at least 0")
    keys = args.workload or LAYERS
    rows = ([ranking(key, args.threads, args.configs) for key in keys] if args.configs
            else [measure(key, args.threads) for key in keys])
    import llvmlite.binding as llvm

    json.dump({"cpu": cpu_facts()["cpu_model"], "llvm_cpu": llvm.get_host_cpu_name(),
               "threads": args.threads, "layers": rows}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
