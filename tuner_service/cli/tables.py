"""Job progress as a table that fits 80 columns and reads the same when redirected.

Workload keys are long (``conv2d:N=1,C=64,...,epilogue=scale+bias+relu``); tables show a short
label instead (``conv 64>64 56x56 3x3``) and ``--json`` gives machines the full keys.
"""

from __future__ import annotations

import sys
from typing import Any

from tuner_service.tuning.remote import JobProgress

_ABBREVIATIONS = {"conv2d": "conv", "depthwise_conv2d": "dwconv", "batch_matmul": "bmm",
                  "dense": "dense"}


def short_label(key: str) -> str:
    """A label of at most about 30 characters that tells a model's layers apart."""
    from schedule_templates.errors import ScheduleError
    from schedule_templates.workloads import parse_workload

    try:
        w: Any = parse_workload(key)
    except ScheduleError:
        return key if len(key) <= 30 else key[:29] + "…"
    op = _ABBREVIATIONS.get(w.op, w.op)
    if w.op in ("conv2d", "depthwise_conv2d"):
        channels = f"{w.C}>{w.K}" if w.op == "conv2d" else f"{w.C}"
        label = f"{op} {channels} {w.H}x{w.W} {w.R}x{w.S}"
        if max(w.stride) > 1:
            label += f"/{w.stride[0]}"
    elif w.op == "dense":
        label = f"{op} {w.M}x{w.K}x{w.N}"
    elif w.op == "batch_matmul":
        label = f"{op} {w.B}x{w.M}x{w.K}x{w.N}"
    else:
        label = op
    epilogue = getattr(w, "epilogue", None)
    if epilogue is not None and getattr(epilogue, "residual", False):
        label += " +res"
    return label


def _cells(progress: JobProgress) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for task in progress.tasks:
        gflops, latency = task.best_gflops, task.best_latency_s
        rows.append((str(task.task_id), short_label(task.workload), str(task.weight),
                     f"{task.trials_done}/{task.trials_budget}",
                     f"{gflops:.1f}" if gflops else "-",
                     f"{latency * 1e3:.3f}" if latency else "-", task.status))
    return rows


HEADER = ("task", "layer", "w", "trials", "GFLOPS", "ms", "status")


def title(progress: JobProgress) -> str:
    text = f"job {progress.job_id}: {progress.status}"
    latency = progress.estimated_latency_s
    if latency is not None:
        text += f", estimated {latency * 1e3:.3g} ms per inference"
    return text


def plain_table(progress: JobProgress) -> str:
    rows = [HEADER, *_cells(progress)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = [title(progress)]
    for row in rows:
        cells = [c.ljust(w) if i in (1, 6) else c.rjust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    lines += _notes(progress)
    return "\n".join(lines)


def _notes(progress: JobProgress) -> list[str]:
    notes = [f"note: {progress.health}"] if progress.health else []
    if progress.message:
        notes.append(progress.message)
    return notes


def rich_table(progress: JobProgress) -> Any:
    from rich.table import Table

    table = Table(title=title(progress), caption="\n".join(_notes(progress)) or None,
                  caption_justify="left")
    for i, column in enumerate(HEADER):
        table.add_column(column, justify="left" if i in (1, 6) else "right", no_wrap=True)
    for row in _cells(progress):
        table.add_row(*row)
    return table


def interactive() -> bool:
    """Live redraws only on a terminal; redirected output gets plain lines."""
    return sys.stdout.isatty()
