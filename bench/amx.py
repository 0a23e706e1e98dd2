"""AMX tiles against the vector kernels, layer by layer, interleaved in one process.

Each workload's default config is built twice on this host: on AMX tiles (what the templates
lower to where ``x86_amx_gemm.host_amx`` holds) and with the tiles switched off (VNNI /
AVX-512 BF16 vector kernels), then both are timed in alternating rounds (so a change of the
machine's speed hits them alike) and their outputs compared byte for byte (int8) or within
bf16's tolerance. Keys without a low-precision twin (an fp32 ``dense``) are timed once, as the
baseline their row names. Prints one JSON object.

    python bench/amx.py [--threads 1] [--rounds 7] [KEY ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

from schedule_templates import runtime
from schedule_templates.codegen.llvm_jit import host_features
from schedule_templates.templates import x86_amx_gemm
from schedule_templates.templates.base import get_template
from schedule_templates.workloads import parse_workload

#: BERT-base's int8 denses, ResNet-50's int8 convolutions of each kind (the stem too), the
#: 1024^3 dense in int8, bf16 and fp32
DEFAULT_KEYS = (
    "dense_int8:M=128,N=768,K=768,bias=s32",
    "dense_int8:M=128,N=3072,K=768,bias=s32",
    "dense_int8:M=128,N=768,K=3072,bias=s32",
    "conv2d_int8:N=1,C=3,H=224,W=224,K=64,R=7,S=7,stride=2,pad=3,bias=s32",
    "conv2d_int8:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1,bias=s32",
    "conv2d_int8:N=1,C=64,H=56,W=56,K=256,R=1,S=1,bias=s32,residual=u8",
    "conv2d_int8:N=1,C=256,H=14,W=14,K=256,R=3,S=3,pad=1,bias=s32",
    "conv2d_int8:N=1,C=512,H=7,W=7,K=512,R=3,S=3,pad=1,bias=s32",
    "conv2d_int8:N=1,C=512,H=7,W=7,K=2048,R=1,S=1,bias=s32,residual=u8",
    "dense_int8:M=1024,N=1024,K=1024",
    "dense_bf16:M=1024,N=1024,K=1024",
    "dense:M=1024,N=1024,K=1024",
)
CALLS = 10  # calls per timed round


def _prepare(key: str, tiles: bool, threads: int) -> tuple[Any, Any]:
    """(workload, prepared kernel) of the default config, on tiles or not."""
    real = x86_amx_gemm.host_amx
    if not tiles:
        x86_amx_gemm.host_amx = lambda dot="tdpbusd": False  # type: ignore[assignment]
    try:
        workload = parse_workload(key)
        template = get_template(workload.op)
        artifact = runtime.build(workload, template, template.default_config(workload),
                                 threads=threads)
        # pack() asks the host too: keep the tiles off until the arguments are packed
        return workload, artifact.prepare(workload.make_inputs(0))
    finally:
        x86_amx_gemm.host_amx = real  # type: ignore[assignment]


def measure(keys: list[str], threads: int, rounds: int) -> dict[str, Any]:
    runs: list[tuple[str, str, Any, Any]] = []
    for key in keys:
        low_precision = "_int8" in key.split(":")[0] or "_bf16" in key.split(":")[0]
        modes = ("vector", "tiles") if low_precision else ("fp32",)
        for mode in modes:
            workload, prepared = _prepare(key, mode == "tiles", threads)
            runs.append((key, mode, workload, prepared))
    times: dict[tuple[str, str], list[float]] = {(k, m): [] for k, m, _, _ in runs}
    for _ in range(rounds):
        for key, mode, _, prepared in runs:
            prepared.run()
            start = time.perf_counter()
            for _ in range(CALLS):
                prepared.run()
            times[(key, mode)].append((time.perf_counter() - start) / CALLS)
    rows: dict[str, dict[str, Any]] = {}
    outputs: dict[tuple[str, str], np.ndarray] = {}
    for key, mode, workload, prepared in runs:
        best = min(times[(key, mode)])
        row = rows.setdefault(key, {"key": key})
        row[f"{mode}_ms"] = round(statistics.median(times[(key, mode)]) * 1e3, 4)
        row[f"{mode}_best_ms"] = round(best * 1e3, 4)
        row[f"{mode}_gops"] = round(workload.flops() / best / 1e9, 1)
        outputs[(key, mode)] = np.asarray(prepared.output).copy()
    for key, row in rows.items():
        if "tiles_ms" in row:
            row["tiles_speedup"] = round(row["vector_ms"] / row["tiles_ms"], 2)
            a, b = outputs[(key, "vector")], outputs[(key, "tiles")]
            if a.dtype.kind in "iu":
                row["same_bytes"] = bool(np.array_equal(a, b))
            else:
                row["max_rel_diff"] = float(np.abs(a - b).max() / max(1e-30, np.abs(a).max()))
    return {"threads": threads, "rounds": rounds, "calls_per_round": CALLS,
            "amx": {dot: x86_amx_gemm.host_amx(dot) for dot in ("tdpbusd", "tdpbf16ps")},
            "cpu_features": [f for f in host_features().split(",") if "amx" in f and f[0] == "+"],
            "rows": list(rows.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("keys", nargs="*", default=list(DEFAULT_KEYS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if not x86_amx_gemm.host_amx("tdpbusd"):
        print(json.dumps({"skipped": "this host (CPU or kernel) grants no AMX tiles"}))
        sys.exit(0)
    print(json.dumps(measure(args.keys, args.threads, args.rounds), indent=1))


if __name__ == "__main__":
    main()
