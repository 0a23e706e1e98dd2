"""Baseline throughput (numpy, PyTorch) of one workload, run in a fresh process so that the
library gets exactly the requested thread count and its idle threads cannot disturb our timings.

Usage: python bench/baselines.py WORKLOAD_KEY THREADS  -> one JSON object on stdout.
"""

from __future__ import annotations

import os
import sys

THREADS = sys.argv[2] if len(sys.argv) > 2 else "1"
os.environ["OPENBLAS_NUM_THREADS"] = THREADS
os.environ["OMP_NUM_THREADS"] = THREADS

import json  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

from schedule_templates.workloads import parse_workload  # noqa: E402


def best_seconds(fn: Callable[[], object], min_s: float = 0.2, repeat: int = 5) -> float:
    fn()
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        if time.perf_counter() - start >= min_s / repeat or number > 1 << 20:
            break
        number *= 2
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number)
    return min(samples)


def numpy_fn(workload, inputs):  # type: ignore[no-untyped-def]
    import numpy as np

    if workload.op == "dense":
        data, wt = inputs["data"], inputs["weight"].T.copy()
        out = np.empty(workload.output_shape(), np.float32)
        return lambda: np.matmul(data, wt, out=out)
    if workload.op == "batch_matmul":
        out = np.empty(workload.output_shape(), np.float32)
        return lambda: np.matmul(inputs["x"], inputs["y"], out=out)
    return None


def torch_fn(workload, inputs):  # type: ignore[no-untyped-def]
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(int(THREADS))
    t = {k: torch.from_numpy(v) for k, v in inputs.items()}
    if workload.op == "dense":
        out = torch.empty(workload.output_shape())
        return lambda: torch.matmul(t["data"], t["weight"].T, out=out)
    if workload.op == "batch_matmul":
        out = torch.empty(workload.output_shape())
        return lambda: torch.bmm(t["x"], t["y"], out=out)
    top, left, bottom, right = workload.pad
    groups = 1 if workload.op == "conv2d" else workload.C
    conv = torch.nn.functional.conv2d
    if (top, left) == (bottom, right):
        return lambda: conv(t["data"], t["weight"], None, workload.stride, (top, left),
                            workload.dilation, groups)
    padded = torch.nn.functional.pad
    return lambda: conv(padded(t["data"], (left, right, top, bottom)), t["weight"], None,
                        workload.stride, 0, workload.dilation, groups)


def main() -> None:
    workload = parse_workload(sys.argv[1])
    inputs = workload.make_inputs(0)
    report: dict[str, float | None] = {}
    for name, make in (("numpy_gflops", numpy_fn), ("torch_gflops", torch_fn)):
        fn = make(workload, inputs)
        if fn is None:
            report[name] = None
            continue
        seconds = best_seconds(fn)  # torch tensors here never require grad
        report[name] = workload.flops() / seconds / 1e9
    print(json.dumps(report))


if __name__ == "__main__":
    main()
