"""Tuned kernels against numpy, PyTorch and the machine's measured FMA peak, in one run.

    python bench/kernels.py [--quick] [--threads T] [--trials N] [--json]
    python bench/kernels.py --target "cuda -arch=sm_90" [--quick]   (on a GPU machine)

Prints one JSON object per workload, then a summary object. Baselines run in fresh processes
with the same thread count; the peak is our own generated FMA loop on the same threads.
On the CPU, each dense row also tunes the same shape in int8 (u8 x s8, requantized to u8: VNNI
where the host has it, vpmaddwd on AVX2) and bf16 (fp32 accumulation; hosts with AVX-512 BF16
only), and each convolution row (conv2d, group and depthwise) its ``conv2d_int8`` twin, and
reports them against our fp32 kernel and against the peak of its own instruction, measured by the
same generated loop as the fp32 peak (``int8_peak_gops``: vpdpbusd, or vpmaddwd + vpaddd on
AVX2 hosts; ``bf16_peak_gops``: vdpbf16ps; on hosts with AMX, the tile loop of
``peak.tile_peak_kernel`` instead, since the kernels run on tiles there; where an instruction
issues less often than an FMA, as vdpbf16ps does on Intel's Xeons, the low-precision kernel
cannot reach twice the fp32 one).
``--no-lowp`` skips; shapes a low-precision layout cannot take get a ``*_skipped`` reason
instead. ``--narrow-int8``: the int8 twins promise weights within +-64 (``weights=narrow``,
what ``reduce_range`` quantization gives), which AVX2 hosts run on vpmaddubsw, and the int8
peak is that instruction's there.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see tuner_service/cli/main.py

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workloads import ALL, MOBILENET_V2_DEPTHWISE, RESNET18_CONVS

from schedule_templates.codegen.llvm_jit import host_features
from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.peak import measure_peak_gflops, measure_tile_peak_gops
from schedule_templates.records import MeasureOptions
from schedule_templates.templates.base import get_template
from schedule_templates.templates.x86_amx_gemm import host_amx
from schedule_templates.workloads import (
    BatchMatmul,
    Conv2d,
    Conv2dBf16,
    Conv2dInt8,
    Dense,
    DepthwiseConv2d,
    GroupConv2d,
    parse_workload,
)
from tuner_service.tuners import make_tuner
from tuner_service.tuning.isolated import IsolatedMeasure
from tuner_service.tuning.local_loop import best_trial, tune

HERE = Path(__file__).resolve().parent
#: the issue's GPU headline: dense 4096^3 against cuBLAS
CUDA_EXTRA = ["dense:M=4096,N=4096,K=4096"]


def baselines(key: str, threads: int, target: str = "llvm") -> dict[str, Any]:
    # on a GPU the vendor libraries (cuBLAS, cuDNN) through PyTorch, fp32 with TF32 off
    args = [key] if target.startswith("cuda") else [key, str(threads)]
    script = "cuda_baselines.py" if target.startswith("cuda") else "baselines.py"
    out = subprocess.run([sys.executable, str(HERE / script), *args],
                         capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def tune_one(key: str, threads: int, trials: int, tuner_name: str, seed: int,
             target: str = "llvm") -> dict[str, Any]:
    workload = parse_workload(key)
    template = get_template(workload.op, target)
    tuner = make_tuner(tuner_name, workload, template.space(workload), seed, template=template)
    options = MeasureOptions(number=1, repeat=3, min_repeat_ms=40.0)
    start = time.perf_counter()
    with IsolatedMeasure(key, template.name, target, threads, options) as measure:
        history = tune(workload, tuner, trials, measure, batch=8,
                       initial=[template.default_config(workload).index])
    best = best_trial(history)
    default = history[0].gflops if history else 0.0
    return {
        "tuned_gflops": best.gflops if best else 0.0,
        "default_gflops": default,
        "best_config": best.config.to_json() if best else None,
        "errors": sum(not t.result.ok for t in history),
        "tuning_s": time.perf_counter() - start,
    }


def low_precision_keys(key: str, narrow: bool = False) -> dict[str, str]:
    """column -> the low-precision twin of a plain fp32 key: int8 and bf16 for dense and
    for ordinary and grouped convolutions, int8 for depthwise ones (same geometry, groups
    carried over), bf16 for batch_matmul; none for the rest. ``narrow``: int8 keys with
    ``weights=narrow``."""
    twins = _twins(key)
    if narrow and "int8" in twins:
        twins["int8"] += ",weights=narrow"
    return twins


def _twins(key: str) -> dict[str, str]:
    workload = parse_workload(key)
    if workload.epilogue_spec:
        return {}
    if isinstance(workload, Dense):
        shape = f"M={workload.M},N={workload.N},K={workload.K}"
        return {"int8": f"dense_int8:{shape}", "bf16": f"dense_bf16:{shape}"}
    if isinstance(workload, BatchMatmul):
        return {"bf16": workload.key.replace("batch_matmul:", "batch_matmul_bf16:", 1)}
    if isinstance(workload, Conv2d | GroupConv2d | DepthwiseConv2d):
        groups = (workload.C if isinstance(workload, DepthwiseConv2d)
                  else getattr(workload, "groups", 1))
        channels = (workload.C * workload.multiplier if isinstance(workload, DepthwiseConv2d)
                    else workload.K)
        int8 = Conv2dInt8(workload.N, workload.C, workload.H, workload.W, workload.R,
                          workload.S, workload.stride, workload.pad, workload.dilation,
                          K=channels, groups=groups)
        if isinstance(workload, DepthwiseConv2d):
            return {"int8": int8.key}
        bf16 = Conv2dBf16(workload.N, workload.C, workload.H, workload.W, workload.R,
                          workload.S, workload.stride, workload.pad, workload.dilation,
                          K=channels, groups=groups)
        return {"int8": int8.key, "bf16": bf16.key}
    return {}


#: the dot-product instruction each low-precision column's kernels run on (VNNI, AVX-512 BF16)
DOT_INSTRUCTION = {"int8": "vpdpbusd", "bf16": "dpbf16ps"}
#: the host feature each needs (int8 has the vpmaddwd path elsewhere, with no peak probe)
DOT_FEATURE = {"int8": "+avx512vnni", "bf16": "+avx512bf16"}


def dot_peaks(threads: int, narrow: bool = False) -> dict[str, float]:
    """column -> the peak of its dot-product instruction on this host, where it has one
    (``narrow``: int8 of narrow weights, vpmaddubsw where VNNI is missing)."""
    features = set(host_features().split(","))
    peaks = {column: measure_peak_gflops(threads, instruction=DOT_INSTRUCTION[column])
             for column, feature in DOT_FEATURE.items() if feature in features}
    if "int8" not in peaks and "+avx2" in features:  # int8 runs on vpmaddwd there
        peaks["int8"] = measure_peak_gflops(threads, instruction="pmaddubsw" if narrow
                                            else "pmaddwd")
    for column, dot in (("int8", "tdpbusd"), ("bf16", "tdpbf16ps")):
        if host_amx(dot):  # the dense and convolution kernels run on AMX tiles there
            peaks[column] = measure_tile_peak_gops(threads, dot)
    return peaks


def low_precision(key: str, threads: int, trials: int, tuner_name: str, seed: int,
                  target: str = "llvm", narrow: bool = False) -> dict[str, Any]:
    """int8 and bf16 columns for a plain key (``low_precision_keys``): tuned and default
    throughput (int8 in integer operations per second, counted like FLOPs). On a GPU: int8
    only (dp4a), with PyTorch's int8 matmul (cuBLASLt, tensor cores) where it has one."""
    row: dict[str, Any] = {}
    gpu = target.startswith("cuda")
    features = set() if gpu else set(host_features().split(","))
    for column, lowp_key in low_precision_keys(key, narrow).items():
        if column == "bf16" and gpu:
            row[f"{column}_skipped"] = "no bf16 CUDA template yet"
            continue
        if column == "bf16" and "+avx512bf16" not in features:
            row[f"{column}_skipped"] = "this host lacks AVX-512 BF16"
            continue
        op = lowp_key.partition(":")[0]
        try:
            get_template(op, target).space(parse_workload(lowp_key))
        except InvalidWorkloadError as e:
            row[f"{column}_skipped"] = str(e)
            continue
        result = tune_one(lowp_key, threads, trials, tuner_name, seed, target)
        if gpu:
            library = baselines(lowp_key, threads, target)
            row[f"{column}_torch_gops"] = library.get("torch_gflops")
            row[f"{column}_torch_reason"] = library.get("reason")
        row[f"{column}_workload"] = lowp_key
        row[f"{column}_tuned_gops"] = result["tuned_gflops"]
        row[f"{column}_default_gops"] = result["default_gflops"]
        row[f"{column}_best_config"] = result["best_config"]
        row[f"{column}_errors"] = result["errors"]
    return row


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials (under 5 minutes)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--trials", type=int, help="trials per workload (default 12 quick, 64)")
    parser.add_argument("--tuner", default="random")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", default="llvm",
                        help="llvm, or cuda -arch=sm_90 (tuned on the GPU, against cuBLAS/cuDNN)")
    parser.add_argument("--only", action="append",
                        help="substring filter on workload keys (repeat: any of them)")
    parser.add_argument("--json", action="store_true", help="JSON lines only")
    parser.add_argument("--narrow-int8", action="store_true",
                        help="int8 twins with weights within +-64 (weights=narrow)")
    parser.add_argument("--no-lowp", action="store_true",
                        help="skip the int8 and bf16 columns of dense and convolution rows")
    args = parser.parse_args()
    trials = args.trials or (12 if args.quick else 64)
    gpu = args.target.startswith("cuda")
    peak = None if gpu else measure_peak_gflops(args.threads)
    lowp_peaks = {} if gpu or args.no_lowp else dot_peaks(args.threads, args.narrow_int8)
    rows = []
    keys = [*CUDA_EXTRA, *ALL] if gpu else ALL
    for key in [k for k in keys if not args.only or any(part in k for part in args.only)]:
        row: dict[str, Any] = {"workload": key, "threads": args.threads, "trials": trials}
        row.update(tune_one(key, args.threads, trials, args.tuner, args.seed, args.target))
        row.update(baselines(key, args.threads, args.target))
        if gpu and not args.no_lowp:
            row.update(low_precision(key, args.threads, trials, args.tuner, args.seed,
                                     args.target))
            row["int8_vs_fp32"] = ratio(row.get("int8_tuned_gops"), row["tuned_gflops"])
            row["int8_vs_torch_int8"] = ratio(row.get("int8_tuned_gops"),
                                              row.get("int8_torch_gops"))
        if not gpu and not args.no_lowp:
            row.update(low_precision(key, args.threads, trials, args.tuner, args.seed,
                                     narrow=args.narrow_int8))
            for column in ("int8", "bf16"):
                row[f"{column}_vs_fp32"] = ratio(row.get(f"{column}_tuned_gops"),
                                                 row["tuned_gflops"])
                row[f"{column}_peak_gops"] = lowp_peaks.get(column)
                row[f"{column}_fraction_of_peak"] = ratio(row.get(f"{column}_tuned_gops"),
                                                          lowp_peaks.get(column))
        row["peak_gflops"] = peak
        row["fraction_of_peak"] = ratio(row["tuned_gflops"], peak)
        row["vs_numpy"] = ratio(row["tuned_gflops"], row.get("numpy_gflops"))
        row["vs_torch"] = ratio(row["tuned_gflops"], row["torch_gflops"])
        rows.append(row)
        print(json.dumps(row) if args.json else
              f"{key:<62} tuned {row['tuned_gflops']:7.1f}  torch {row['torch_gflops'] or 0:7.1f}"
              f"  numpy {row.get('numpy_gflops') or 0:7.1f}  peak {peak or 0:6.1f}"
              + "".join(f"  {c} {row[c + '_tuned_gops']:7.1f}" for c in ("int8", "bf16")
                        if row.get(c + "_tuned_gops")), flush=True)
    by_key = {r["workload"]: r for r in rows}
    summary = {
        "summary": True, "threads": args.threads, "trials": trials, "peak_gflops": peak,
        **{f"{column}_peak_gops": value for column, value in lowp_peaks.items()},
        "resnet18_conv_geomean_vs_torch": geomean(
            [by_key[k]["vs_torch"] for k in RESNET18_CONVS if k in by_key]),
        "resnet18_3x3_min_fraction_of_peak": min(
            (by_key[k]["fraction_of_peak"] for k in RESNET18_CONVS
             if k in by_key and "R=3" in k and by_key[k]["fraction_of_peak"]), default=None),
        "depthwise_geomean_vs_torch": geomean(
            [by_key[k]["vs_torch"] for k in MOBILENET_V2_DEPTHWISE if k in by_key]),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
