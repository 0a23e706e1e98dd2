"""``tuner build --layout auto``: build the plain and the blocked plan (and up to two plans that
mix them layer by layer, ``layout_mixed``), time them on this machine, keep the fastest.

Which layout wins depends on the model (a network of 1x1 and depthwise convs gains most from
blocked activations; DenseNet's 3x3 convs are faster NCHW with Winograd) and on the machine, so
the choice is measured, not guessed: both libraries are built, each runs the same seeded inputs
a few times, interleaved (a loaded machine slows both alike; a one-thread library is timed in
process CPU time), and the faster one's files become the output. The manifest's
``layout_choice`` records both medians.

Each plan takes the tuned configs of the workloads it runs: the plain plan those of ``conv2d``
and ``depthwise_conv2d``, the blocked plan those of ``conv2d_nchwc`` and
``depthwise_conv2d_nchwc`` (``tuner tune --layout auto`` tunes both), each layer without one its
template default. So tuned configs of one layout alone do not decide the choice: both plans are
timed as they would run, ``layout_choice`` also records how many kernels of each were tuned,
and a warning says when the kept plan runs fewer tuned kernels than the other.
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
from tuner_service.compiler.deploy.layout_mixed import mixed_plans
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
                      layout: str = "auto", precision: str = "fp32", int8: str = "auto"
                      ) -> dict[str, Any]:
    """``build_library`` for ``nchw`` and ``nchwc``; for ``auto`` both, each with the configs
    of its own workloads, timed, the faster kept (the plain plan alone where the blocked one
    would block nothing, or without generated operators)."""
    check_layout(layout, generated)
    if layout == "auto" and not generated:
        layout = "nchw"  # blocked plans need the generated transforms
    if layout != "auto":
        return build_library(model, book, out_dir, target, threads, input_shapes, generated,
                             layout, precision, int8=int8)
    with tempfile.TemporaryDirectory(prefix="tuner-layout-") as tmp:
        dirs = {mode: Path(tmp) / mode for mode in ("nchw", "nchwc")}
        manifests = {mode: build_library(model, book, path, target, threads, input_shapes,
                                         generated, mode, precision, int8=int8)
                     for mode, path in dirs.items()}
        if not _blocks_anything(manifests["nchwc"]):
            # nothing would be blocked (no conv layers): the two libraries are the same
            return _copy_build(dirs["nchw"], out_dir, manifests["nchw"])
        medians = _time_libraries(model, dirs, input_shapes)
        mixed = mixed_plans(*(ModelRunner(model, KernelLibrary(dirs[mode]),
                                          input_shapes=input_shapes)
                              for mode in ("nchw", "nchwc")))
        for name, plain in mixed.items():  # per-layer layouts: some conv layers kept plain
            dirs[name] = Path(tmp) / name
            manifests[name] = build_library(model, book, dirs[name], target, threads,
                                            input_shapes, generated, "nchwc", precision, plain,
                                            int8)
        if mixed:  # every plan timed again, side by side
            medians = _time_libraries(model, dirs, input_shapes)
        chosen = min(medians, key=lambda mode: medians[mode])
        tuned = {mode: tuned_kernels(manifest) for mode, manifest in manifests.items()}
        logger.info("layout auto: %s; keeping %s", ", ".join(
            f"{mode} {medians[mode] * 1e3:.2f} ms ({tuned[mode]} tuned kernels)"
            for mode in medians), chosen)
        _warn_fewer_tuned(chosen, tuned, manifests)
        _copy_build(dirs[chosen], out_dir, manifests[chosen])
    manifest_path = out_dir / MANIFEST_FILE
    manifest: dict[str, Any] = json.loads(manifest_path.read_text())
    manifest["layout_choice"] = {
        "chosen": chosen, **{f"{m}_ms": round(s * 1e3, 4) for m, s in medians.items()},
        **{f"{m}_tuned": n for m, n in tuned.items()},
        **{f"{m}_plain_layers": len(plain) for m, plain in mixed.items()}}
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def tuned_kernels(manifest: dict[str, Any]) -> int:
    """How many kernels of a build run a tuned config (the rest their template default), its
    int8 layers' kernels included."""
    return sum(kernel.get("config_source") == "tuned"
               for kernel in [*manifest.get("kernels", []), *manifest.get("int8_kernels", [])])


def _warn_fewer_tuned(chosen: str, tuned: dict[str, int],
                      manifests: dict[str, dict[str, Any]]) -> None:
    other = max((mode for mode in tuned if mode != chosen), key=lambda mode: tuned[mode])
    if tuned[chosen] >= tuned[other]:
        return
    kernels = len(manifests[chosen].get("kernels", []))
    layout = "nchw" if chosen == "nchw" else "nchwc"
    logger.warning("layout auto kept %s, measured faster, though %d of its %d kernels run "
                   "template defaults (%s had %d tuned); tune it with `tuner tune --layout "
                   "%s` (or auto)", chosen, kernels - tuned[chosen], kernels, other,
                   tuned[other], layout)


def _copy_build(source: Path, out_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Copy a finished build's files into ``out_dir``; returns ``manifest``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        shutil.copy2(item, out_dir / item.name)
    return manifest


def _blocks_anything(manifest: dict[str, Any]) -> bool:
    """Whether a blocked build runs any kernel on blocked (or channels-last int8)
    activations."""
    return any(str(kernel.get("workload", "")).split(":", 1)[0].endswith("_nchwc")
               for kernel in manifest.get("kernels", [])) or any(
        "layout=nhwc" in str(kernel.get("workload", ""))
        for kernel in manifest.get("int8_kernels", []))


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
