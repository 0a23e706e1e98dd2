"""``tuner build --layout auto``: build the plain and the blocked plan, time both once on this
machine, keep the faster.

Which layout wins depends on the model (a network of 1x1 and depthwise convs gains most from
blocked activations; DenseNet's 3x3 convs are faster NCHW with Winograd) and on the machine, so
the choice is measured, not guessed: both libraries are built, each runs the same seeded inputs
a few times, interleaved (a loaded machine slows both alike; a one-thread library is timed in
process CPU time), and the faster one's files become the output. The manifest's
``layout_choice`` records both medians.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from tuner_service.compiler.deploy.configs import ConfigBook
from tuner_service.compiler.deploy.executor import ModelRunner
from tuner_service.compiler.deploy.layout import check_layout
from tuner_service.compiler.deploy.library import MANIFEST_FILE, build_library
from tuner_service.compiler.deploy.loader import KernelLibrary
from tuner_service.compiler.frontend.loading import ModelInput
from tuner_service.compiler.frontend.shapes import InputShapes

logger = logging.getLogger(__name__)

#: interleaved rounds of the timing, and runs per round
ROUNDS = 5
RUNS = 3


def build_with_layout(model: ModelInput, book: ConfigBook, out_dir: Path,
                      target: str = "llvm", threads: int | None = None,
                      input_shapes: InputShapes | None = None, generated: bool = True,
                      layout: str = "auto", precision: str = "fp32") -> dict[str, Any]:
    """``build_library`` for ``nchw`` and ``nchwc``; for ``auto`` both, timed, the faster kept
    (the plain plan alone where the blocked one would block nothing, where tuned configs are
    used (they are for the plain layout's tasks), or without generated operators)."""
    check_layout(layout, generated)
    if layout == "auto" and not generated:
        layout = "nchw"  # blocked plans need the generated transforms
    if layout != "auto":
        return build_library(model, book, out_dir, target, threads, input_shapes, generated,
                             layout, precision)
    with tempfile.TemporaryDirectory(prefix="tuner-layout-") as tmp:
        dirs = {mode: Path(tmp) / mode for mode in ("nchw", "nchwc")}
        plain = build_library(model, book, dirs["nchw"], target, threads, input_shapes,
                              generated, "nchw", precision)
        blocked = None if _uses_tuned_configs(plain) else build_library(
            model, book, dirs["nchwc"], target, threads, input_shapes, generated, "nchwc",
            precision)
        if blocked is None or not _blocks_anything(blocked):
            # tuned configs are for the plain layout's tasks (blocked layers would run
            # template defaults), or nothing would be blocked (no conv layers): keep it plain
            return _copy_build(dirs["nchw"], out_dir, plain)
        medians = _time_libraries(model, dirs, input_shapes)
        chosen = min(medians, key=lambda mode: medians[mode])
        logger.info("layout auto: nchw %.2f ms, nchwc %.2f ms: keeping %s",
                    medians["nchw"] * 1e3, medians["nchwc"] * 1e3, chosen)
        _copy_build(dirs[chosen], out_dir, plain)
    manifest_path = out_dir / MANIFEST_FILE
    manifest: dict[str, Any] = json.loads(manifest_path.read_text())
    manifest["layout_choice"] = {"chosen": chosen,
                                 **{f"{m}_ms": round(s * 1e3, 4) for m, s in medians.items()}}
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _uses_tuned_configs(manifest: dict[str, Any]) -> bool:
    return any(kernel.get("config_source") == "tuned" for kernel in manifest.get("kernels", []))


def _copy_build(source: Path, out_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Copy a finished build's files into ``out_dir``; returns ``manifest``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        shutil.copy2(item, out_dir / item.name)
    return manifest


def _blocks_anything(manifest: dict[str, Any]) -> bool:
    """Whether a blocked build runs any kernel on blocked activations."""
    return any(str(kernel.get("workload", "")).split(":", 1)[0].endswith("_nchwc")
               for kernel in manifest.get("kernels", []))


def _time_libraries(model: ModelInput, dirs: dict[str, Path],
                    input_shapes: InputShapes | None) -> dict[str, float]:
    """Median seconds per run of each library on the same inputs, rounds interleaved."""
    runners = {mode: ModelRunner(model, KernelLibrary(d), input_shapes=input_shapes)
               for mode, d in dirs.items()}
    feeds = next(iter(runners.values())).random_feeds(0)
    # one thread: process CPU time, which a loaded machine's descheduling does not inflate;
    # more: wall time (CPU time would count the threads' spinning between layers)
    clock = time.process_time if all(r.threads == 1 for r in runners.values()) \
        else time.perf_counter
    samples: dict[str, list[float]] = {mode: [] for mode in runners}
    for runner in runners.values():
        runner.run(feeds)  # warm-up: first-touch pages, lazy binding
    for _ in range(ROUNDS):
        for mode, runner in runners.items():
            start = clock()
            for _ in range(RUNS):
                runner.run(feeds)
            samples[mode].append((clock() - start) / RUNS)
    return {mode: float(np.median(values)) for mode, values in samples.items()}
