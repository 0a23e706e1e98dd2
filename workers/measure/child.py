"""The body of a measuring child process.

The parent sends ``(task, code)``: ``code`` is the task's object code from the worker's compile
cache, or None. Messages to the parent: ``("phase", name)`` before each phase, ``("code",
bytes)`` after building something the cache may keep, ``("done", (result_json, stages_json))``
at the end. Before timing, the child says ``("phase", "time")`` and waits for the parent's
``"go"``: the parent grants it only when nothing else runs on the timing cores (see ``pool``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import signal
import time
import traceback
from multiprocessing.connection import Connection

from schedule_templates.protocol import ClaimItem
from schedule_templates.records import ErrorKind, MeasureResult
from workers.backends import Backend, BackendSpec, create_backend
from workers.measure.hygiene import QuietGauge
from workers.measure.runner import Phase, measure_task
from workers.timings import StageTimes

logger = logging.getLogger(__name__)

GO = "go"
STOP = None
#: child -> parent, before "done": the backend cannot measure another candidate
RETIRE = "retire"
_PR_SET_PDEATHSIG = 1


def child_main(conn: Connection, spec: BackendSpec) -> None:
    """Measure tasks sent by the parent until it says stop or goes away."""
    _detach_from_signals()
    backend = create_backend(spec)
    # one per child: it remembers the fastest reference loop
    gauge = QuietGauge() if backend.probes_quiet else None
    try:
        while True:
            try:
                message = conn.recv()
            except EOFError:
                return
            if message is STOP:
                return
            task, code = message
            marks: dict[str, float] = {}
            result = _measure(backend, task, code, conn, gauge, marks)
            marks["end"] = time.perf_counter()
            if not backend.healthy():  # say so first: the parent replaces this child
                conn.send((RETIRE, None))
            stages = StageTimes.from_marks(marks).to_json() if "compile" in marks else {}
            conn.send(("done", (result.to_json(), stages)))
    finally:
        backend.close()


def _measure(backend: Backend, task: ClaimItem, code: bytes | None, conn: Connection,
             gauge: QuietGauge | None, marks: dict[str, float]) -> MeasureResult:
    def on_phase(phase: Phase) -> None:
        marks[phase.value] = time.perf_counter()
        conn.send(("phase", phase.value))
        if phase is Phase.TIME:
            if conn.recv() != GO:
                raise RuntimeError("the parent did not grant the timing phase")
            marks["go"] = time.perf_counter()

    def on_code(fresh: bytes) -> None:
        conn.send(("code", fresh))

    try:
        return measure_task(backend, task, on_phase, gauge, code, on_code)
    except Exception:
        # A bug in the runner itself, not in the candidate: report it and keep the child.
        text = traceback.format_exc()
        logger.error("measuring %s failed unexpectedly:\n%s", task.measure_id, text)
        return MeasureResult.failure(ErrorKind.UNKNOWN, text)


def _detach_from_signals() -> None:
    # Ctrl-C and `systemctl stop` signal the whole process group; the parent decides how the
    # child ends (finish the candidate, or a kill), so the child ignores both.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # If the parent dies without cleaning up, do not leave a hung kernel behind (Linux only).
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
