"""The replay dataset behind ``bench/search.py``: a large sample of each space, measured once.

    python bench/search_dataset.py [--only SUBSTRING] [--out DIR]  # measure (resumable)
    python bench/search_dataset.py --refine 40      # and measure each file's 40 fastest again
    python bench/search_dataset.py --summary        # what is stored

One gzip JSON-lines file per workload under ``bench/data/search/``: a header line (workload,
template and version, target, host CPU, space shape, run protocol, noise caveat), then one line
per measured config: ``{"i": index, "c": mean seconds, "m": fastest sample}`` or
``{"i": index, "e": error kind}``.
Spaces with few valid configs are measured whole; larger ones by a seeded uniform sample of
valid configs, plus the template's default config. Real measurements: the worker's isolated
measurer (compile, correctness check against numpy, timed runs in a child process), 1 thread.
An interrupted run resumes where it stopped (the sample is a function of the seed).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import dataclasses
import datetime
import gzip
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from schedule_templates.records import MeasureOptions, MeasureResult
from schedule_templates.space import ConfigSpace
from schedule_templates.templates.base import Template, get_template
from schedule_templates.workloads import parse_workload

FORMAT = "search-replay/1"
DATA_DIR = Path(__file__).resolve().parent / "data" / "search"
TARGET = "llvm"
THREADS = 1
#: the run protocol's repeats, with a shorter sample than the server default to fit the budget
OPTIONS = MeasureOptions(number=1, repeat=3, min_repeat_ms=30.0, build_timeout_s=20.0,
                         run_timeout_s=20.0)
#: spaces with at most this many valid configs are measured whole
EXHAUSTIVE_LIMIT = 400
NOISE = ("measured on a 2-core machine shared with other processes (test suites of other "
         "sessions ran at the same time): single costs can read 10-30% slow; rankings between "
         "configs that differ by less than that are not reliable")

#: (workload key, sampled configs when the space is larger than EXHAUSTIVE_LIMIT)
WORKLOADS: list[tuple[str, int]] = [
    ("dense:M=512,N=512,K=512", 400),
    ("dense:M=128,N=768,K=768", 400),
    ("dense:M=1,N=1000,K=512", 300),  # ResNet-18's classifier
    ("conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1", 400),  # ResNet-18 layer 1
    ("conv2d:N=1,C=128,H=28,W=28,K=128,R=3,S=3,pad=1", 400),  # layer 2
    ("conv2d:N=1,C=256,H=14,W=14,K=256,R=3,S=3,pad=1", 400),  # layer 3
    ("conv2d:N=1,C=128,H=28,W=28,K=256,R=1,S=1,stride=2", 400),  # layer 3 downsample (1x1)
]


@dataclasses.dataclass(frozen=True)
class Record:
    index: int
    cost: float | None  # mean seconds of one run; None when the candidate failed
    error: int = 0
    fastest: float | None = None  # the fastest sample: mean/fastest shows the timing noise

    def to_json(self) -> dict[str, Any]:
        if self.cost is not None:
            return {"i": self.index, "c": float(f"{self.cost:.6g}"),
                    "m": float(f"{self.fastest or self.cost:.6g}")}
        return {"i": self.index, "e": self.error}


@dataclasses.dataclass
class Dataset:
    """One workload's stored measurements."""

    header: dict[str, Any]
    records: list[Record]

    @property
    def key(self) -> str:
        return str(self.header["workload"])

    @property
    def template(self) -> str:
        return str(self.header["template"])

    def costs(self) -> dict[int, float | None]:
        return {r.index: r.cost for r in self.records}


def slug(key: str) -> str:
    return key.replace(":", "_").replace(",", "_").replace("=", "")


def space_signature(space: ConfigSpace) -> list[list[Any]]:
    """Knob names and sizes; knobs appended to a space later (their first option is the old
    behaviour, as most significant digit) leave every recorded index meaning the same config."""
    return [[k.name, len(k.entities)] for k in space.knobs
            if not getattr(k, "appended", False)]


def host_facts() -> dict[str, Any]:
    from workers.hardware import cpu_facts

    facts = cpu_facts()
    return {k: facts[k] for k in ("cpu_model", "logical_cores", "vector_bits", "flags")}


def sample_indices(space: ConfigSpace, template: Template, key: str, n: int,
                   seed: int) -> tuple[list[int], str]:
    """The configs to measure (default first) and how they were chosen."""
    default = template.default_config(parse_workload(key)).index
    if space.size <= 50 * EXHAUSTIVE_LIMIT:
        valid = [i for i in range(space.size) if space.is_valid(i)]
        if len(valid) <= EXHAUSTIVE_LIMIT:
            return [default, *(i for i in valid if i != default)], "all valid configs"
    rng = np.random.default_rng(seed)
    picks = space.sample(n, rng, exclude={default})
    return [default, *picks], f"{len(picks)} valid configs drawn uniformly (seed {seed})"


def read_file(path: Path) -> Dataset:
    with gzip.open(path, "rt") as f:
        header = json.loads(f.readline())
        if header.get("format") != FORMAT:
            raise ValueError(f"{path}: not a {FORMAT} file")
        records = []
        for line in f:
            row = json.loads(line)
            cost, fastest = row.get("c"), row.get("m")
            records.append(Record(int(row["i"]), None if cost is None else float(cost),
                                  int(row.get("e", 0)),
                                  None if fastest is None else float(fastest)))
    return Dataset(header, records)


def load_datasets(directory: Path = DATA_DIR, check: bool = True) -> list[Dataset]:
    """Every complete workload file; with ``check``, refuse files whose template version or
    space shape no longer match the code (their config indices would mean other configs)."""
    out = []
    for path in sorted(directory.glob("*.jsonl.gz")):
        data = read_file(path)
        if check:
            workload = parse_workload(data.key)
            template = get_template(workload.op)
            stale = (template.name != data.template
                     or int(template.version) != int(data.header["version"])
                     or space_signature(template.space(workload)) != data.header["space"])
            if stale:
                raise ValueError(f"{path.name}: recorded for another version of "
                                 f"{data.template}; regenerate with bench/search_dataset.py")
        out.append(data)
    return out


def _result_record(index: int, result: MeasureResult) -> Record:
    if result.ok:
        return Record(index, result.mean_cost, fastest=min(result.costs))
    return Record(index, None, int(result.error))


def _chunks(items: list[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def measure_workload(key: str, n: int, out_dir: Path, seed: int) -> Path:
    """Measure one workload into ``out_dir`` (resuming a partial file); returns the file."""
    from tuner_service.tuning.isolated import IsolatedMeasure

    final = out_dir / f"{slug(key)}.jsonl.gz"
    if final.exists():
        print(f"{key}: done already ({final.name})", flush=True)
        return final
    workload = parse_workload(key)
    template = get_template(workload.op)
    space = template.space(workload)
    indices, how = sample_indices(space, template, key, n, seed)
    partial = out_dir / f"{slug(key)}.partial.jsonl"
    done: dict[int, dict[str, Any]] = {}
    if partial.exists():
        for line in partial.read_text().splitlines():
            row = json.loads(line)
            done[int(row["i"])] = row
    todo = [i for i in indices if i not in done]
    print(f"{key}: {len(indices)} configs ({how}); {len(done)} measured before", flush=True)
    start, loads = time.monotonic(), [os.getloadavg()[0]]
    with IsolatedMeasure(key, template.name, TARGET, THREADS, OPTIONS) as measure, \
            partial.open("a") as log:
        for count, chunk in enumerate(_chunks(todo, 25), start=1):
            results = measure([space.get(i) for i in chunk])
            for index, result in zip(chunk, results, strict=True):
                row = _result_record(index, result).to_json()
                done[index] = row
                log.write(json.dumps(row) + "\n")
            log.flush()
            loads.append(os.getloadavg()[0])
            rate = (time.monotonic() - start) / min(len(todo), count * 25)
            print(f"  {key}: {len(done)}/{len(indices)}  {rate:.2f} s/config", flush=True)
    header = {
        "format": FORMAT, "workload": key, "template": template.name,
        "version": int(template.version), "target": TARGET, "threads": THREADS,
        "flops": workload.flops(), "space_size": space.size, "space": space_signature(space),
        "sampled": how, "default_index": indices[0], "options": OPTIONS.to_json(),
        "host": host_facts(), "nice": os.nice(0),
        "load_average": [round(min(loads), 2), round(max(loads), 2)],
        "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "noise": NOISE,
    }
    write_file(final, header, [done[index] for index in indices])
    partial.unlink()
    print(f"{key}: wrote {final.name} in {time.monotonic() - start:.0f} s", flush=True)
    return final


def write_file(path: Path, header: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt") as f:
        f.write(json.dumps(header) + "\n")
        for row in rows:
            f.write(json.dumps(row) + "\n")
    tmp.rename(path)


def refine_workload(path: Path, top: int) -> None:
    """Measure the ``top`` fastest configs of a file again, at another time: each keeps the
    fastest sample of both passes and the mean of both means, so that one unlucky moment on a
    shared machine decides less about which config is the best."""
    from tuner_service.tuning.isolated import IsolatedMeasure

    data = read_file(path)
    if int(data.header.get("refined_top", 0)) >= top:
        print(f"{data.key}: refined already", flush=True)
        return
    best = sorted((r for r in data.records if r.cost is not None),
                  key=lambda r: r.fastest or r.cost or 0.0)[:top]
    workload = parse_workload(data.key)
    space = get_template(workload.op).space(workload)
    with IsolatedMeasure(data.key, data.template, TARGET, THREADS, OPTIONS) as measure:
        results = measure([space.get(r.index) for r in best])
    again = {}
    for old, result in zip(best, results, strict=True):
        if result.ok and old.cost is not None:  # a failure now keeps the first measurement
            fastest = min(old.fastest or old.cost, min(result.costs))
            again[old.index] = Record(old.index, (old.cost + result.mean_cost) / 2, 0, fastest)
    header = {**data.header, "refined_top": top, "refine_load_average": os.getloadavg()[0],
              "refined_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    write_file(path, header, [again.get(r.index, r).to_json() for r in data.records])
    print(f"{data.key}: refined {len(again)} of the top {top}", flush=True)


def summary(directory: Path) -> list[dict[str, Any]]:
    """Per file: throughput by each config's fastest sample (what the replay uses), the mean
    for comparison, and how noisy the timings were."""
    rows = []
    for data in load_datasets(directory, check=False):
        flops = float(data.header["flops"])
        ok = [r for r in data.records if r.cost is not None]
        fastest = sorted((flops / (r.fastest or r.cost or 1.0) / 1e9 for r in ok), reverse=True)
        mean_best = max((flops / (r.cost or 1.0) / 1e9 for r in ok), default=None)
        default = next(r for r in data.records if r.index == int(data.header["default_index"]))
        rows.append({
            "workload": data.key, "configs": len(data.records),
            "failed": len(data.records) - len(ok),
            "best_gflops": round(fastest[0], 1) if fastest else None,
            "best_gflops_by_mean": round(mean_best, 1) if mean_best else None,
            "median_gflops": round(fastest[len(fastest) // 2], 1) if fastest else None,
            "default_gflops": round(flops / (default.fastest or default.cost) / 1e9, 1)
            if default.cost else None,
            "configs_within_95pct": sum(g >= 0.95 * fastest[0] for g in fastest),
            # timing noise: how much slower the mean of the samples is than the fastest one
            "mean_over_fastest_p50_p90": [round(float(q), 3) for q in np.percentile(
                [r.cost / r.fastest for r in ok if r.cost and r.fastest], [50, 90])],
            "load_average": data.header.get("load_average"),
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DATA_DIR)
    parser.add_argument("--only", help="substring filter on workload keys")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--summary", action="store_true", help="describe the stored files")
    parser.add_argument("--refine", type=int, metavar="N",
                        help="measure the N fastest configs of each stored file again")
    args = parser.parse_args()
    if args.summary:
        for row in summary(args.out):
            print(json.dumps(row))
        return
    if os.nice(0) > 0:
        print("warning: running under nice; timings compete with other processes",
              file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    for key, n in WORKLOADS:
        if not args.only or args.only in key:
            path = measure_workload(key, n, args.out, args.seed)
            if args.refine:
                refine_workload(path, args.refine)


if __name__ == "__main__":
    main()
