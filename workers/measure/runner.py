"""One candidate, in the current process: check, compile, verify against numpy, time.

Expected failures become classified ``MeasureResult``s (error kinds of DESIGN.md section 5).
Crashes and hangs cannot be caught here: ``IsolatedMeasurer`` runs this in a child process and
classifies those from outside.
"""

from __future__ import annotations

import enum
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from schedule_templates.errors import (
    DeviceCompileError,
    InvalidConfigError,
    InvalidWorkloadError,
    ScheduleError,
)
from schedule_templates.protocol import Candidate, ClaimItem, Target
from schedule_templates.records import ErrorKind, MeasureOptions, MeasureResult
from workers.backends import Backend, BackendSpec, BoundKernel, create_backend
from workers.measure.hygiene import QuietGauge

logger = logging.getLogger(__name__)

RTOL = 1e-3
#: absolute tolerance per unit of sqrt(reduction length): fp32 rounding of a sum of n products
#: of values in [-1, 1] grows like sqrt(n)
ATOL_PER_SQRT_REDUCTION = 1e-4


class Phase(enum.Enum):
    """Where a candidate is; the isolation layer picks the timeout and error kind from it."""

    COMPILE = "compile"  # check + build + bind inputs: build timeout, crash -> compile host
    VERIFY = "verify"  # one run compared with numpy: run timeout, crash -> runtime
    TIME = "time"  # the timed protocol; exclusive on the machine


PhaseHook = Callable[[Phase], None]


def measure_candidate(workload_key: str, template_name: str, config_json: dict[str, Any],
                      target: str, options: MeasureOptions, threads: int) -> MeasureResult:
    """Measure one config in this process with the backend that ``target`` names (``llvm``)."""
    parsed = Target.parse(target or "llvm")
    backend = create_backend(BackendSpec(parsed.kind))
    task = ClaimItem(0, Candidate(template_name, workload_key, config_json), parsed, options,
                     threads)
    try:
        return measure_task(backend, task, gauge=QuietGauge() if backend.probes_quiet else None)
    finally:
        backend.close()


def measure_task(backend: Backend, task: ClaimItem, on_phase: PhaseHook | None = None,
                 gauge: QuietGauge | None = None, code: bytes | None = None,
                 on_code: Callable[[bytes], None] | None = None) -> MeasureResult:
    """Check, compile, verify and time one task; ``on_phase`` is told before each phase (its
    own duration is excluded from the wall time: the pool blocks in it to serialize timing).
    With a ``gauge``, a run on a machine that is not quiet is measured again or flagged.
    ``code`` is the task's cached build; freshly built code goes to ``on_code``."""
    hook = on_phase or _ignore_phase
    start = time.perf_counter()
    hook(Phase.COMPILE)
    try:
        resolved = backend.check(task)
        kernel, fresh = backend.compile_cached(task, resolved, code)
    except Exception as e:
        return _failure(_compile_error_kind(e), e, wall_time_s=time.perf_counter() - start)
    compile_time_s = time.perf_counter() - start
    if fresh is not None and on_code is not None:
        on_code(fresh)
    try:
        return _verify_and_time(backend, kernel, task.options, hook, start, compile_time_s,
                                gauge)
    finally:
        kernel.close()


def _verify_and_time(backend: Backend, kernel: BoundKernel, options: MeasureOptions,
                     hook: PhaseHook, start: float, compile_time_s: float,
                     gauge: QuietGauge | None) -> MeasureResult:
    times = {"compile_time_s": compile_time_s}
    if options.check_correctness:
        hook(Phase.VERIFY)
        try:
            kernel.run()
        except Exception as e:
            return _failure(ErrorKind.RUNTIME, e, wall_time_s=time.perf_counter() - start, **times)
        wrong = compare_output(kernel)
        if wrong is not None:
            return MeasureResult.failure(ErrorKind.WRONG_ANSWER, wrong,
                                         wall_time_s=time.perf_counter() - start, **times)
    waited = time.perf_counter()
    hook(Phase.TIME)
    waited = time.perf_counter() - waited
    try:
        if gauge is None:
            costs, seen = backend.run(kernel, options), None
        else:
            costs, seen, _attempts = gauge.measure(lambda: backend.run(kernel, options))
    except Exception as e:
        wall = time.perf_counter() - start - waited
        return _failure(ErrorKind.RUNTIME, e, wall_time_s=wall, **times)
    return MeasureResult(costs=tuple(float(c) for c in costs), compile_time_s=compile_time_s,
                         wall_time_s=time.perf_counter() - start - waited,
                         noisy=seen is not None and not seen.quiet,
                         load=seen.other_load if seen is not None else None)


def compare_output(kernel: BoundKernel) -> str | None:
    """None when the output matches the reference within tolerance, else what is wrong."""
    out = np.asarray(kernel.output)
    ref = np.asarray(kernel.expected())
    if out.shape != ref.shape:
        return f"output has shape {out.shape}, the reference {ref.shape}"
    finite = np.isfinite(out)
    if not finite.all():
        return f"{int((~finite).sum())} of {out.size} output values are not finite"
    atol = ATOL_PER_SQRT_REDUCTION * math.sqrt(max(1, kernel.reduction_length))
    ref = ref.astype(np.float64)  # np.abs of an int8 -128 is still -128
    error = np.abs(out.astype(np.float64) - ref)
    bad = error > atol + RTOL * np.abs(ref)
    if not bad.any():
        return None
    worst = np.unravel_index(int(np.argmax(error)), error.shape)
    return (f"wrong answer: {int(bad.sum())} of {out.size} values outside tolerance "
            f"(rtol {RTOL:g}, atol {atol:.3g}); max abs error {float(error[worst]):.4g} at "
            f"{tuple(int(i) for i in worst)}: got {float(out[worst]):.6g}, "
            f"expected {float(ref[worst]):.6g}")


def _compile_error_kind(error: Exception) -> ErrorKind:
    if isinstance(error, InvalidConfigError | InvalidWorkloadError):
        return ErrorKind.INSTANTIATION
    if isinstance(error, DeviceCompileError):
        return ErrorKind.COMPILE_DEVICE
    if isinstance(error, ScheduleError):
        return ErrorKind.COMPILE_HOST
    # Not an expected failure: a bug in a template or the code generator. It is recorded (the
    # worker must keep going) and logged with its traceback so that it gets fixed.
    logger.error("unexpected error while building a candidate", exc_info=error)
    return ErrorKind.UNKNOWN


def _failure(kind: ErrorKind, error: BaseException, **times: float) -> MeasureResult:
    return MeasureResult.failure(kind, f"{type(error).__name__}: {error}", **times)


def _ignore_phase(phase: Phase) -> None:
    """The in-process default: no timeouts to arm, nothing to wait for."""
