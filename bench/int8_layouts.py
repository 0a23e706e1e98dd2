"""int8 convolutions on NCHW against channels-last activations, layer by layer, in one process.

Each ``conv2d_int8`` key is built three times with its default config: as given (NCHW in and
out), writing channels-last (``out_layout=nhwc``, with the shortcut channels-last too where
the layer adds one) and reading and writing channels-last (``in_layout=nhwc`` as well, where
the input channels fill whole words). The kernels are timed in alternating rounds (a change of
the machine's speed hits them alike) and each one's output is compared with its own
workload's reference, byte for byte. Prints one JSON object: per key the median ms of each
layout and its ratio to NCHW.

    python bench/int8_layouts.py [--threads 1] [--rounds 15] [KEY ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np

from schedule_templates import runtime
from schedule_templates.templates.base import get_template
from schedule_templates.workloads import Conv2dInt8, parse_workload
from workers.hardware import cpu_facts

#: ResNet-50's int8 convolutions of each kind (what ``--layout nchwc`` lays out)
DEFAULT_KEYS = (
    "conv2d_int8:N=1,C=3,H=224,W=224,K=64,R=7,S=7,stride=2,pad=3,bias=s32",
    "conv2d_int8:N=1,C=256,H=56,W=56,K=64,R=1,S=1,bias=s32",
    "conv2d_int8:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1,bias=s32",
    "conv2d_int8:N=1,C=64,H=56,W=56,K=256,R=1,S=1,bias=s32,residual=u8",
    "conv2d_int8:N=1,C=128,H=56,W=56,K=128,R=3,S=3,stride=2,pad=1,bias=s32",
    "conv2d_int8:N=1,C=128,H=28,W=28,K=128,R=3,S=3,pad=1,bias=s32",
    "conv2d_int8:N=1,C=512,H=28,W=28,K=128,R=1,S=1,bias=s32",
    "conv2d_int8:N=1,C=512,H=28,W=28,K=1024,R=1,S=1,stride=2,bias=s32",
    "conv2d_int8:N=1,C=1024,H=14,W=14,K=256,R=1,S=1,bias=s32",
    "conv2d_int8:N=1,C=256,H=14,W=14,K=256,R=3,S=3,pad=1,bias=s32",
    "conv2d_int8:N=1,C=512,H=7,W=7,K=512,R=3,S=3,pad=1,bias=s32",
    "conv2d_int8:N=1,C=512,H=7,W=7,K=2048,R=1,S=1,bias=s32,residual=u8",
)
CALLS = 10  # calls per timed round


def layouts(key: str) -> dict[str, str]:
    """The layout variants of an NCHW ``conv2d_int8`` key that its shape admits."""
    workload = parse_workload(key)
    if not isinstance(workload, Conv2dInt8) or workload.channels_last:
        raise SystemExit(f"int8_layouts: {key} is not an NCHW conv2d_int8 key")
    if workload.groups != 1 or workload.K % 16:
        return {"nchw": key}
    shortcut = ",residual_layout=nhwc" if workload.residual != "none" else ""
    variants = {"nchw": key, "out_nhwc": f"{key},out_layout=nhwc{shortcut}"}
    if workload.C % 4 == 0:
        variants["nhwc"] = f"{key},in_layout=nhwc,out_layout=nhwc{shortcut}"
    return variants


def measure(keys: list[str], threads: int, rounds: int) -> dict[str, Any]:
    runs: list[tuple[str, str, Any, list[float]]] = []
    exact: dict[tuple[str, str], bool] = {}
    for key in keys:
        for name, variant in layouts(key).items():
            workload = parse_workload(variant)
            template = get_template(workload.op)
            artifact = runtime.build(workload, template, template.default_config(workload),
                                     threads=threads)
            inputs = workload.make_inputs(0)
            prepared = artifact.prepare(inputs)
            prepared.run()
            out = np.asarray(prepared.output).reshape(workload.output_shape())
            exact[(key, name)] = bool(np.array_equal(out, workload.reference(inputs)))
            runs.append((key, name, prepared, []))
    for _ in range(rounds):
        for _, _, prepared, times in runs:
            prepared.run()
            start = time.perf_counter()
            for _ in range(CALLS):
                prepared.run()
            times.append((time.perf_counter() - start) / CALLS)
    rows: dict[str, dict[str, Any]] = {}
    for key, name, _, times in runs:
        row = rows.setdefault(key, {"key": key})
        row[f"{name}_ms"] = round(statistics.median(times) * 1e3, 4)
        row[f"{name}_exact"] = exact[(key, name)]
    for row in rows.values():
        for name in ("out_nhwc", "nhwc"):
            if f"{name}_ms" in row:
                row[f"{name}_vs_nchw"] = round(row[f"{name}_ms"] / row["nchw_ms"], 3)
    return {"threads": threads, "rounds": rounds, "calls_per_round": CALLS,
            "cpu": cpu_facts().get("cpu_model"), "rows": list(rows.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("keys", nargs="*", default=list(DEFAULT_KEYS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    print(json.dumps(measure(args.keys, args.threads, args.rounds), indent=1))


if __name__ == "__main__":
    main()
