"""The bf16 columns of the end-to-end benchmark (``bench/e2e.py --bf16``): each fp32 model built
with ``tuner build --precision bf16`` (dense layers on bfloat16 products, fp32 tensors between
layers) and timed beside our fp32 build, onnxruntime (fp32: its x86 CPU provider has no bf16
mode for an fp32 model) and OpenVINO asked to infer in bf16 (``INFERENCE_PRECISION_HINT``), in
the same run. ``default`` uses the templates' default configs; ``tuned`` configs come from
``tuner tune KEY`` on each task that ``tuner extract --precision bf16`` lists (xgb, the same
trials per task as the fp32 rows, at the thread count measured), cached per CPU in
``bench/.e2e-cache/configs``. (``tuner tune MODEL.onnx`` jobs take fp32 tasks only so far.)
The deviation from onnxruntime's fp32 output is reported (bf16 keeps about 3 significant
digits per product).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from e2e_models import CACHE, BenchModel
from e2e_tune import device_slug
from zoo import build, call, run_ours, run_peer, tuner_command

logger = logging.getLogger("e2e.bf16")


def tune_tasks(model: BenchModel, threads: int, trials: int | None) -> dict[str, Any]:
    """Records of every bf16-build task tuned alone (cached); ``trials`` None: cache only."""
    records = CACHE / "configs" / f"{model.name}-bf16-t{threads}-{device_slug()}.jsonl"
    if records.exists():
        return {"configs": str(records), "origin": "cache"}
    if trials is None:
        return {"skipped": "no cached configs (run with --tune)"}
    data, error, _ = call([*tuner_command(), "extract", str(model.path), "--precision", "bf16",
                           "--json"], "extract")
    if data is None:
        return {"error": error}
    partial = records.with_suffix(".partial")
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.unlink(missing_ok=True)
    seconds = 0.0
    for task in data["tasks"]:
        logger.info("%s: tuning %s at %d thread(s)", model.name, task["workload"], threads)
        done, error, took = call([*tuner_command(), "tune", task["workload"], "--trials",
                                  str(trials), "--tuner", "xgb", "--threads", str(threads),
                                  "--save-records", str(partial), "--json"], "tune")
        if done is None:
            return {"error": f"{task['workload']}: {error}"}
        seconds += took
    partial.rename(records)
    return {"configs": str(records), "origin": "new", "tasks": len(data["tasks"]),
            "trials_per_task": trials, "tuning_s": round(seconds, 1)}


def bf16_rows(model: BenchModel, threads: list[int], iterations: int, tmp: Path,
              trials: int | None) -> list[dict[str, Any]]:
    """One row per thread count, named ``MODEL-bf16``: ``default`` and ``tuned`` are our bf16
    builds, ``fp32_default`` our fp32 build, ``openvino`` OpenVINO in bf16, ``onnxruntime``
    fp32."""
    path = str(model.path)
    libraries = {"default": build(path, tmp / "default", precision="bf16")}
    if libraries["default"].get("bf16_layers") == 0:
        logger.info("%s: no dense layer the bf16 template takes; no bf16 row", model.name)
        return []
    libraries["fp32_default"] = build(path, tmp / "fp32_default")
    tunings = {count: tune_tasks(model, count, trials) for count in threads}
    rows = []
    for count in threads:
        logger.info("%s: bf16 at %d thread(s)", model.name, count)
        engines: dict[str, Any] = {}
        if "configs" in tunings[count]:
            libraries[f"tuned-t{count}"] = build(path, tmp / f"tuned-t{count}",
                                                 Path(tunings[count]["configs"]), count, "bf16")
        for name, library in (("default", "default"), ("fp32_default", "fp32_default"),
                              ("tuned", f"tuned-t{count}")):
            built = libraries.get(library, {"skipped": "no tuned configs"})
            engines[name] = (built if "error" in built or "skipped" in built
                             else run_ours(path, tmp / library, count, iterations))
        engines["onnxruntime"] = run_peer("onnxruntime", path, count, iterations)
        engines["openvino"] = run_peer("openvino-bf16", path, count, iterations)
        engines["torch"] = {"error": "not measured for bf16"}
        rows.append({"model": f"{model.name}-bf16", "kind": model.kind, "threads": count,
                     "engines": engines, "tuning": tunings[count], "libraries": libraries})
    return rows
