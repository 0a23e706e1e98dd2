"""The end-to-end benchmark's ratios, geometric means and Markdown (``docs/e2e.md``).

A ratio is peer ms / our ms, so above 1 means we are faster. "Best peer" is the faster of
onnxruntime and OpenVINO in that row (whichever ran): the issue's bar is beating both.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from zoo_report import fmt_ms, host_line, load_note

PEERS = ("onnxruntime", "openvino")
OURS = ("default", "tuned")


def _ms(result: dict[str, Any] | None) -> float | None:
    value = (result or {}).get("ms")
    return float(value) if value else None


def best_peer(engines: dict[str, Any]) -> tuple[str, float] | None:
    timed = [(name, ms) for name in PEERS if (ms := _ms(engines.get(name))) is not None]
    return min(timed, key=lambda item: item[1]) if timed else None


def ratios(engines: dict[str, Any]) -> dict[str, float | None]:
    """``{ours}_vs_best`` and ``{ours}_vs_onnxruntime`` for default and tuned."""
    best = best_peer(engines)
    ort = _ms(engines.get("onnxruntime"))
    out: dict[str, float | None] = {}
    for ours in OURS:
        ms = _ms(engines.get(ours))
        out[f"{ours}_vs_best"] = best[1] / ms if best and ms else None
        out[f"{ours}_vs_onnxruntime"] = ort / ms if ort and ms else None
    return out


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


#: rows of a lower precision are named MODEL-int8 / MODEL-bf16 (``e2e_int8``, ``e2e_bf16``);
#: MODEL-int8r: int8 with 7-bit weights (``--reduce-range``)
PRECISIONS = ("fp32", "int8", "int8r", "bf16")
#: the relative error ``problems`` flags above, per precision (int8 rows differ from
#: onnxruntime's fused kernels by whole quantization steps: docs/quantized.md compares them)
MAX_REL_ERROR: dict[str, float | None] = {"fp32": 1e-4, "bf16": 1e-2, "int8": None,
                                          "int8r": None}


def precision(row: dict[str, Any]) -> str:
    suffix = str(row["model"]).rsplit("-", 1)[-1]
    return suffix if suffix in PRECISIONS else "fp32"


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per thread count and group (samples, zoo; each precision apart): geometric means of the
    ratios over the models that have them, and how many models the tuned build runs faster
    than both peers."""
    out = []
    groups = [(kind, p) for kind in ("sample", "zoo") for p in PRECISIONS]
    for threads in sorted({r["threads"] for r in rows}):
        for kind, level in groups:
            group = [r for r in rows if r["threads"] == threads and r["kind"] == kind
                     and precision(r) == level]
            if not group:
                continue
            label = kind if level == "fp32" else f"{kind} {level}"
            entry: dict[str, Any] = {"threads": threads, "kind": label, "models": len(group)}
            for key in ("tuned_vs_best", "default_vs_best", "tuned_vs_onnxruntime",
                        "default_vs_onnxruntime"):
                values = [r["ratios"][key] for r in group if r["ratios"][key] is not None]
                entry[f"geomean_{key}"] = geomean(values)
                entry[f"n_{key}"] = len(values)
            entry["tuned_beats_both"] = sum(
                1 for r in group if (r["ratios"]["tuned_vs_best"] or 0) > 1
                and all(_ms(r["engines"].get(p)) for p in PEERS))
            out.append(entry)
    return out


def _fmt(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _steps(row: dict[str, Any]) -> str:
    run = row["engines"].get("tuned") or {}
    if "ms" not in run:
        run = row["engines"].get("default") or {}
    counts = {k: v for k, v in run.items() if k.endswith(("_steps", "_layers"))}
    return ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in sorted(counts.items()))


def _error(row: dict[str, Any]) -> str:
    errors = [row["engines"].get(o, {}).get("max_rel_error") for o in OURS]
    known = [e for e in errors if e is not None]
    return f"{max(known):.1e}" if known else ""


def _budget(row: dict[str, Any]) -> str:
    tuning = row.get("tuning") or {}
    if "trials" not in tuning:
        return "err" if "error" in tuning else ""
    return f"{tuning['trials']} / {tuning['wall_s']:.0f}"


def _paired(row: dict[str, Any]) -> str:
    """The one-process medians the ratios came from: default / tuned / ORT / OpenVINO."""
    paired = row.get("paired") or {}
    if "error" in paired:
        return "err"
    return " / ".join(_fmt(paired.get(k), 1) or "-" for k in ("default", "tuned", *PEERS)) \
        if paired else ""


def table(rows: list[dict[str, Any]], threads: int) -> list[str]:
    picked = [r for r in rows if r["threads"] == threads]
    with_paired = any("paired" in r for r in picked)
    head = ["model", "default ms", "tuned ms", "ORT ms", "OpenVINO ms", "PyTorch ms",
            *(["paired ms: default / tuned / ORT / OpenVINO"] if with_paired else []),
            "tuned vs best peer", "default vs best peer", "default vs ORT", "max rel err",
            "steps (tuned run)", "tuning trials / s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in picked:
        e, r = row["engines"], row["ratios"]
        cells = [row["model"], *(fmt_ms(e.get(k)) for k in
                                 ("default", "tuned", "onnxruntime", "openvino", "torch")),
                 *([_paired(row)] if with_paired else []),
                 _fmt(r["tuned_vs_best"]), _fmt(r["default_vs_best"]),
                 _fmt(r["default_vs_onnxruntime"]), _error(row), _steps(row), _budget(row)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary_table(entries: list[dict[str, Any]]) -> list[str]:
    head = ["threads", "models", "geomean tuned vs best peer", "tuned faster than both",
            "geomean default vs best peer", "geomean default vs ORT"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in entries:
        cells = [str(s["threads"]), f"{s['kind']} ({s['models']})",
                 _fmt(s["geomean_tuned_vs_best"]), str(s["tuned_beats_both"]),
                 _fmt(s["geomean_default_vs_best"]), _fmt(s["geomean_default_vs_onnxruntime"])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def problems(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for row in rows:
        name = f"{row['model']} @{row['threads']}"
        for engine, result in row["engines"].items():
            if "error" in result:
                lines.append(f"- {name}: {engine} failed: `{result['error']}`")
            rel, limit = result.get("max_rel_error"), MAX_REL_ERROR[precision(row)]
            if rel is not None and limit is not None and rel > limit:
                lines.append(f"- {name}: {engine} relative error {rel:.1e} above {limit:g}")
        if "error" in (row.get("paired") or {}):
            lines.append(f"- {name}: the paired run failed (ratios from the fresh processes): "
                         f"`{row['paired']['error']}`")
        if "error" in (row.get("tuning") or {}):
            lines.append(f"- {name}: tuning failed: `{row['tuning']['error']}`")
    return lines or ["- none"]


HEADER = """# End to end: our builds against onnxruntime, OpenVINO and PyTorch

Generated by `python bench/e2e.py {command}`. Batch 1, fp32 (OpenVINO with
INFERENCE_PRECISION_HINT f32), random weights; samples built in code, zoo models exported with
the {exporter} exporter (`bash scripts/zoo_env.sh`). Each number is the median of {iterations}
runs in a fresh process at that thread count. **Tuned** configs come from real `tuner tune`
jobs (embedded server, `{tuner}`, at most {trials} trials per task, at the measured thread
count, one shared tuning database per thread count so that earlier models warm the log);
"tuning trials / s" is the budget the job used. Ratios are peer ms / our ms (above 1: we are
faster); "best peer" is the faster of onnxruntime and OpenVINO. Relative error: max |ours -
onnxruntime| / max |onnxruntime| over the outputs (target 1e-4). OpenVINO comes with `bash
scripts/setup.sh` (the `bench` extra); where it did not run, the best peer is onnxruntime
and Problems says so. Thread wait policy: `bench/omp_policy.py` (see `WAIT_POLICY` in
`tuner_service/compiler/deploy/loader.py`). Rows named `MODEL-int8` (`--int8`) run the model
quantized by onnxruntime's `quantize_static` (QDQ) in every engine, our int8 layers summing
their products as onnxruntime does on the measuring CPU (`tuner build --int8 auto`: pairs in
saturating 16 bits without AVX-512 VNNI, exactly with it; a library's `int8_arithmetic` says
which); rows named `MODEL-bf16`
(`--bf16`) are our `--precision bf16` build against onnxruntime fp32 and OpenVINO in bf16
(target error 1e-2). The summary keeps each precision apart. With `--paired ROUNDS`, a row's
ratios come from a paired run instead: our builds and both peers run in turn in one process for
ROUNDS rounds (`bench/paired.py`), and each ratio is the median over rounds of the two runs of
the same round, so a change of the machine's speed during the run moves both sides alike (the
"paired ms" column shows each engine's median, whose ratios may differ from those).

{host}
{load_note}
{smoke_note}
"""
#: below these a run checks the pipeline rather than measuring it
FULL_TRIALS, FULL_ITERATIONS = 32, 5


def smoke_note(report: dict[str, Any]) -> str:
    if report["trials_per_task"] >= FULL_TRIALS and report["iterations"] >= FULL_ITERATIONS:
        return ""
    return (f"**Smoke run** ({report['trials_per_task']} trials per task, {report['iterations']} "
            "runs per number): it shows the pipeline works end to end; its ratios say nothing "
            f"about speed. The full table needs `--trials {FULL_TRIALS}` on an idle machine.")


def write_docs(report: dict[str, Any], path: Path) -> None:
    rows = report["rows"]
    text = HEADER.format(command=report["command"], exporter=report["exporter"],
                         iterations=report["iterations"], tuner=report["tuner"],
                         trials=report["trials_per_task"], host=host_line(report["host"]),
                         load_note=load_note(report["host"]), smoke_note=smoke_note(report))
    body = [text, "## Summary", "", *summary_table(report["summary"]), ""]
    for threads in sorted({r["threads"] for r in rows}):
        body += [f"## {threads} thread{'s' if threads > 1 else ''}", "", *table(rows, threads),
                 ""]
    body += ["## Problems", "", *problems(rows), ""]
    path.write_text("\n".join(body))
