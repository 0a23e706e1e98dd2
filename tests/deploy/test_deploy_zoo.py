"""A few zoo models end to end (``bench/zoo.py``): exported by torch's two exporters in the
exporter environment, then extracted, built and run by the ``tuner`` commands; outputs within
1e-4 of onnxruntime and no layer left untunable. Skipped, with the reason, where the exporter
environment (``bash scripts/zoo_env.sh``) is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ZOO_PYTHON = ROOT / ".venv-zoo" / "bin" / "python"
MODELS = ("squeezenet1_1", "mobilenet_v3_large")


def _exporter_missing() -> str | None:
    if not ZOO_PYTHON.exists():
        return f"no exporter environment at {ZOO_PYTHON} (create it: bash scripts/zoo_env.sh)"
    probe = subprocess.run([str(ZOO_PYTHON), "-c", "import torch, torchvision, onnxscript"],
                           capture_output=True, text=True, timeout=300, check=False)
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines() or ["import failed"]
        return f"the exporter environment cannot import torch/torchvision: {lines[-1]}"
    return None


@pytest.mark.slow
def test_zoo_models_build_and_match_onnxruntime() -> None:
    reason = _exporter_missing()
    if reason:
        pytest.skip(reason)
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "zoo.py"), "--models", ",".join(MODELS),
         "--threads", "1", "--iterations", "1", "--no-docs", "--json"],
        capture_output=True, text=True, timeout=1800, check=False, cwd=ROOT,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    entries = {(e["model"], e["exporter"]): e for e in results["models"]}
    assert set(entries) == {(m, x) for m in MODELS for x in ("torchscript", "dynamo")}
    for key, entry in entries.items():
        assert entry["stage"] == "ok", (key, entry.get("error"))
        assert entry["extract"]["tasks"] > 0 and entry["extract"]["unsupported"] == 0, key
        assert entry["build"]["build_s"] > 0
        run = entry["runs"]["1"]
        assert run["ours"]["max_rel_error"] <= 1e-4, key
        assert run["ours"]["ms"] > 0 and run["onnxruntime"]["ms"] > 0
        assert not run["ours"]["reference_evaluator"], key
