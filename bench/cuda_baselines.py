"""Vendor-library throughput of one workload on the GPU: cuBLAS (dense, batch_matmul) and
cuDNN (conv2d, depthwise) through PyTorch, fp32 with TF32 off, timed with CUDA events.
``dense_int8`` runs PyTorch's int8 matmul (``torch._int_mm``: cuBLASLt on the int8 tensor
cores, s8 x s8 -> s32, no requantization; it needs M > 16 and K, N multiples of 8).
``conv2d_int8`` has no int8 convolution in PyTorch on CUDA: reported as such.

Usage: python bench/cuda_baselines.py WORKLOAD_KEY  -> one JSON object on stdout.
Fails soft: without torch or a GPU it prints ``{"torch_gflops": null, "reason": ...}``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from schedule_templates.workloads import parse_workload


def torch_call(torch: Any, workload: Any, inputs: dict[str, Any]) -> Callable[[], object]:
    """The library call for the workload, on tensors already on the GPU."""
    f = torch.nn.functional
    if workload.op == "dense_int8":
        data = torch.from_numpy(inputs["data"].view("int8")).cuda()  # the bytes, as s8
        weight_t = torch.from_numpy(inputs["weight"]).cuda().t()
        return lambda: torch._int_mm(data, weight_t)
    dev = {k: torch.from_numpy(v).cuda() for k, v in inputs.items()}
    out = torch.empty(workload.output_shape(), device="cuda")
    if workload.op == "dense":
        weight_t = dev["weight"].t()  # cuBLAS runs the transposed operand without a copy
        return lambda: torch.matmul(dev["data"], weight_t, out=out)
    if workload.op == "batch_matmul":
        return lambda: torch.bmm(dev["x"], dev["y"], out=out)
    top, left, bottom, right = workload.pad
    data = dev["data"]
    if (top, left) != (bottom, right):  # asymmetric padding: pad once, outside the timing
        data = f.pad(data, (left, right, top, bottom))
        top = left = 0
    groups = workload.C if workload.op == "depthwise_conv2d" else 1
    return lambda: f.conv2d(data, dev["weight"], stride=workload.stride, padding=(top, left),
                            dilation=workload.dilation, groups=groups)


def gflops(key: str, min_ms: float = 200.0, repeat: int = 5) -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"torch_gflops": None, "reason": "torch is not installed"}
    if not torch.cuda.is_available():
        return {"torch_gflops": None, "reason": "no CUDA device for torch"}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True  # let cuDNN pick its fastest algorithm
    workload = parse_workload(key)
    if workload.op == "conv2d_int8":
        return {"torch_gflops": None, "reason": "PyTorch has no int8 convolution on CUDA"}
    try:
        fn = torch_call(torch, workload, workload.make_inputs(0))
        fn()
    except RuntimeError as e:  # e.g. _int_mm's shape rules
        return {"torch_gflops": None, "reason": f"{type(e).__name__}: {e}"[:300]}
    with torch.no_grad():
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        number = 1
        while True:
            start.record()
            for _ in range(number):
                fn()
            end.record()
            end.synchronize()
            if start.elapsed_time(end) >= min_ms / repeat or number >= 1 << 16:
                break
            number *= 2
        samples = []
        for _ in range(repeat):
            start.record()
            for _ in range(number):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1000.0 / number)
    seconds = min(samples)
    return {"torch_gflops": workload.flops() / seconds / 1e9, "torch_s": seconds,
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}


if __name__ == "__main__":
    print(json.dumps(gflops(sys.argv[1])))
