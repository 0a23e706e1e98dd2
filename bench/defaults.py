"""How close each template's default config is to the best config of its space, on real layers.

A model built without tuning runs every layer with ``Template.default_config``, so the speed of
an untuned build is the speed of those defaults. For real layer shapes (the sample models'
tasks, the layers of any ONNX files given with ``--model``, and a few hand-listed layers of
zoo models that the samples do not cover), this measures the default and the best of ``--random``
random valid configs plus the neighbours of the best one, at each ``--threads`` count. Timing is
in-process (``schedule_templates.runtime``): warm-up, then the median of ``--runs`` calls. The
machine may be shared, so the default and the best are finally timed again in alternation
(``--confirm`` rounds) and the ratio reported is that of the confirmation medians. Prints JSON:
per shape, default and best ms (``found_ms``: the searched config's, which a default may beat),
default/best, the configs' entities; per template the geometric mean of default/best.

    python bench/defaults.py --random 48 --threads 1 2 --ops conv2d dense
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from schedule_templates.errors import InvalidConfigError
from schedule_templates.runtime import PreparedKernel, build
from schedule_templates.space import Config
from schedule_templates.templates.base import Template, get_template
from schedule_templates.workloads import Workload, parse_workload
from tuner_service.compiler.frontend.extract import extract_tasks
from tuner_service.compiler.frontend.samples import SAMPLE_MODELS, sample_model_bytes

#: layers of zoo models whose kinds the samples lack (read off the torchvision architectures):
#: ResNet-50 bottlenecks, MobileNet-v3 / EfficientNet-B0 depthwise 5x5 and squeeze-excite
#: denses, DenseNet-121's growth convs, ViT-B/16's patch embedding, denses and attention,
#: SqueezeNet 1.1's output extents without small divisors (111, 55, 27, 13)
ZOO_LAYERS = (
    "conv2d:N=1,C=256,H=56,W=56,K=64,R=1,S=1",
    "conv2d:N=1,C=64,H=56,W=56,K=256,R=1,S=1",
    "conv2d:N=1,C=512,H=28,W=28,K=128,R=1,S=1",
    "conv2d:N=1,C=1024,H=14,W=14,K=256,R=1,S=1",
    "conv2d:N=1,C=512,H=7,W=7,K=2048,R=1,S=1",
    "conv2d:N=1,C=128,H=56,W=56,K=32,R=3,S=3,pad=1",
    "conv2d:N=1,C=128,H=14,W=14,K=32,R=3,S=3,pad=1",
    "conv2d:N=1,C=3,H=224,W=224,K=768,R=16,S=16,stride=16",
    "conv2d:N=1,C=40,H=28,W=28,K=240,R=1,S=1",
    "conv2d:N=1,C=3,H=224,W=224,K=64,R=3,S=3,stride=2",
    "conv2d:N=1,C=128,H=55,W=55,K=16,R=1,S=1",
    "conv2d:N=1,C=16,H=55,W=55,K=64,R=3,S=3,pad=1",
    "conv2d:N=1,C=32,H=27,W=27,K=128,R=3,S=3,pad=1",
    "conv2d:N=1,C=512,H=13,W=13,K=1000,R=1,S=1",
    "depthwise_conv2d:N=1,C=240,H=28,W=28,R=5,S=5,pad=2",
    "depthwise_conv2d:N=1,C=672,H=14,W=14,R=5,S=5,stride=2,pad=2",
    "depthwise_conv2d:N=1,C=72,H=56,W=56,R=5,S=5,stride=2,pad=2",
    "group_conv2d:N=1,C=256,H=56,W=56,K=256,R=3,S=3,pad=1,groups=32",
    "group_conv2d:N=1,C=512,H=28,W=28,K=512,R=3,S=3,stride=2,pad=1,groups=32",
    "group_conv2d:N=1,C=336,H=28,W=28,K=336,R=3,S=3,pad=1,groups=42",
    "dense:M=197,N=768,K=768",
    "dense:M=197,N=3072,K=768",
    "dense:M=197,N=768,K=3072",
    "dense:M=1,N=1000,K=2048",
    "batch_matmul:B=12,M=197,N=197,K=64",
    "batch_matmul:B=12,M=197,N=64,K=197",
)


def layer_keys(models: Iterable[Path]) -> list[str]:
    """Workload keys of the samples' tasks, the given ONNX files' tasks and ``ZOO_LAYERS``."""
    keys: list[str] = []
    sources: list[bytes | Path] = [sample_model_bytes(name) for name in SAMPLE_MODELS]
    for source in [*sources, *models]:
        keys += [task.workload.key for task in extract_tasks(source).tasks]
    keys += ZOO_LAYERS
    return list(dict.fromkeys(keys))


def time_ms(prepared: PreparedKernel, runs: int) -> float:
    """Median ms of ``runs`` calls after a warm-up of about 50 ms (at least two calls)."""
    start, calls = time.perf_counter(), 0
    while calls < 2 or time.perf_counter() - start < 0.05:
        prepared.run()
        calls += 1
    costs = []
    for _ in range(runs):
        t0 = time.perf_counter()
        prepared.run()
        costs.append(time.perf_counter() - t0)
    return statistics.median(costs) * 1e3


class Bench:
    """Compiles and times configs of one workload at one thread count."""

    def __init__(self, workload: Workload, threads: int, runs: int) -> None:
        self.workload = workload
        self.template: Template = get_template(workload.op)
        self.space = self.template.space(workload)
        self.threads = threads
        self.runs = runs
        self.inputs = workload.make_inputs(0)
        self.kernels: dict[int, PreparedKernel] = {}

    def prepare(self, config: Config) -> PreparedKernel:
        if config.index not in self.kernels:
            artifact = build(self.workload, self.template, config, threads=self.threads)
            self.kernels[config.index] = artifact.prepare(self.inputs)
        return self.kernels[config.index]

    def measure(self, index: int) -> float:
        ms = time_ms(self.prepare(self.space.get(index)), self.runs)
        if len(self.kernels) > 4:  # keep only a few compiled kernels alive
            for stale in [i for i in self.kernels if i != index][:-3]:
                self.kernels.pop(stale).close()
        return ms

    def check(self, index: int) -> None:
        """Raise if ``index``'s output is not numpy's (a fast wrong kernel must not win)."""
        prepared = self.prepare(self.space.get(index))
        prepared.run()
        reference = self.workload.reference(self.inputs)
        scale = float(np.abs(reference).max()) or 1.0
        error = float(np.abs(prepared.output - reference).max()) / scale
        if error > 1e-3:
            raise SystemExit(f"{self.workload.key} config {index}: relative error {error:.2e}")


def search(bench: Bench, n_random: int, seed: int) -> tuple[int, float]:
    """The best (index, ms) of ``n_random`` random valid configs and the best's neighbours."""
    rng = np.random.default_rng(seed)
    default = bench.template.default_config(bench.workload).index
    timed: dict[int, float] = {}
    for index in bench.space.sample(n_random, rng, exclude=[default]):
        timed[index] = bench.measure(index)
    best = min(timed, key=timed.__getitem__) if timed else default
    for index in bench.space.neighbors(best):
        if index not in timed and index != default and bench.space.is_valid(index):
            timed[index] = bench.measure(index)
    best = min(timed, key=timed.__getitem__) if timed else default
    return best, timed.get(best, math.inf)


def compare(key: str, threads: int, args: argparse.Namespace, known: Config | None = None
            ) -> dict[str, Any]:
    """Default vs the best found (or ``known``, a best found by an earlier run) on one shape."""
    workload = parse_workload(key)
    bench = Bench(workload, threads, args.runs)
    default = bench.template.default_config(workload)
    bench.check(default.index)
    best = known.index if known is not None else search(bench, args.random, args.seed)[0]
    bench.check(best)
    rounds: dict[int, list[float]] = {default.index: [], best: []}
    for _ in range(args.confirm):
        for index in rounds:
            rounds[index].append(bench.measure(index))
    default_ms = statistics.median(rounds[default.index])
    found_ms = statistics.median(rounds[best])
    best_ms = min(found_ms, default_ms)  # the default is in the space too
    for kernel in bench.kernels.values():
        kernel.close()
    return {"workload": key, "template": bench.template.name, "threads": threads,
            "default_ms": round(default_ms, 4), "best_ms": round(best_ms, 4),
            "found_ms": round(found_ms, 4),
            "default_over_best": round(default_ms / best_ms, 3),
            "default": _entities(bench.space.get(default.index)),
            "best": _entities(bench.space.get(best))}


def _entities(config: Config) -> dict[str, Any]:
    return {name: value for name, _kind, value in config.to_json()["entity"]}


def earlier_bests(path: Path) -> dict[tuple[str, int], Config | None]:
    """(workload key, threads) -> best config of an earlier run's output, to time a changed
    default against without searching again; None where the space has changed since (that
    shape is searched again)."""
    bests: dict[tuple[str, int], Config | None] = {}
    for row in json.loads(path.read_text())["shapes"]:
        workload = parse_workload(row["workload"])
        space = get_template(workload.op).space(workload)
        try:
            entity = [[k.name, k.kind, row["best"][k.name]] for k in space.knobs]
            bests[row["workload"], row["threads"]] = space.from_json({"entity": entity})
        except (KeyError, InvalidConfigError):
            bests[row["workload"], row["threads"]] = None
    return bests


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per template and thread count: shapes measured and the geometric mean default/best."""
    groups: dict[str, list[float]] = {}
    for row in rows:
        groups.setdefault(f"{row['template']}@{row['threads']}", []).append(
            row["default_over_best"])
    return {name: {"shapes": len(ratios),
                   "geomean_default_over_best": round(math.exp(statistics.fmean(
                       math.log(r) for r in ratios)), 3)}
            for name, ratios in sorted(groups.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, action="append", default=[],
                        help="an ONNX file whose layers are measured too (repeatable)")
    parser.add_argument("--workload", action="append", default=[],
                        help="measure this workload key instead of the model layers (repeatable)")
    parser.add_argument("--ops", nargs="*", default=None, help="only these operators")
    parser.add_argument("--match", default=None, help="only workload keys containing this")
    parser.add_argument("--limit", type=int, default=None, help="at most this many per op")
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--random", type=int, default=48)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--confirm", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--best-from", type=Path, default=None,
                        help="an earlier run's JSON: time its shapes' best configs instead of "
                             "searching (searching again where the space has changed)")
    args = parser.parse_args(argv)
    for model in args.model:
        if not model.is_file():
            parser.error(f"--model {model}: no such file")
    keys = [k for k in args.workload or layer_keys(args.model)
            if (args.ops is None or parse_workload(k).op in args.ops)
            and (args.match is None or args.match in k)]
    if args.limit is not None:
        by_op: dict[str, list[str]] = {}
        for key in keys:
            by_op.setdefault(parse_workload(key).op, []).append(key)
        keys = [key for group in by_op.values() for key in group[: args.limit]]
    known = earlier_bests(args.best_from) if args.best_from else {}
    rows = []
    for key in keys:
        for threads in args.threads:
            if args.best_from and (key, threads) not in known:
                continue
            rows.append(compare(key, threads, args, known.get((key, threads))))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"random": args.random, "runs": args.runs, "confirm": args.confirm,
                      "templates": summary(rows), "shapes": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
