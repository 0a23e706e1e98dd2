"""Job tables fit 80 columns with short layer labels, and say why a job is stuck."""

from __future__ import annotations

from typing import Any

import pytest

from tuner_service.cli.tables import plain_table, short_label
from tuner_service.tuning.remote import JobProgress

KEYS = [
    "conv2d:N=1,C=3,H=224,W=224,K=64,R=7,S=7,stride=2,pad=3,epilogue=scale+bias+relu",
    "conv2d:N=1,C=256,H=14,W=14,K=512,R=1,S=1,stride=2,epilogue=scale+bias+residual+relu",
    "depthwise_conv2d:N=1,C=960,H=7,W=7,R=3,S=3,pad=1,epilogue=scale+bias+relu6",
    "dense:M=1,N=1000,K=512,epilogue=bias",
    "batch_matmul:B=12,M=128,N=128,K=64",
]


@pytest.mark.parametrize("key", KEYS)
def test_labels_are_short(key: str) -> None:
    assert len(short_label(key)) <= 30


def test_labels_tell_layers_apart() -> None:
    assert len({short_label(k) for k in KEYS}) == len(KEYS)
    assert short_label(KEYS[0]) == "conv 3>64 224x224 7x7/2"
    assert short_label(KEYS[1]).endswith("+res")


def _status(health: dict[str, str] | None) -> dict[str, Any]:
    tasks = [{"task_id": 100 + i, "workload": key, "weight": 3, "trials_done": 999,
              "trials_budget": 1000, "best_gflops": 1234.5, "best_latency_s": 1.2345e-3,
              "status": "running", "message": ""} for i, key in enumerate(KEYS)]
    return {"job_id": 7, "status": "running", "message": "", "tasks": tasks, "health": health}


def test_plain_table_fits_80_columns() -> None:
    text = plain_table(JobProgress.from_json(_status(None)))
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "estimated" in text.splitlines()[0]  # every task has a best latency


def test_a_stuck_job_says_why() -> None:
    health = {"state": "no_workers", "message": "no worker online for target 'llvm'"}
    progress = JobProgress.from_json(_status(health))
    assert progress.health == health["message"]
    assert f"note: {health['message']}" in plain_table(progress)
