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
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

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


def measure(key: str, threads: int) -> dict[str, Any]:
    workload = parse_workload(key)
    template = get_template(workload.op)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", action="append",
                        help="a workload key to time (repeatable; default: BERT-base's and "
                             "ResNet-50's heaviest layers)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    rows = [measure(key, args.threads) for key in (args.workload or LAYERS)]
    import llvmlite.binding as llvm

    json.dump({"cpu": cpu_facts()["cpu_model"], "llvm_cpu": llvm.get_host_cpu_name(),
               "threads": args.threads, "layers": rows}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
