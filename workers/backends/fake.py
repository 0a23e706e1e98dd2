"""A backend without hardware: deterministic costs per config, and failures on demand.

Costs and failure modes are drawn from a generator seeded by (seed, workload, config index), so
the same config always gets the same answer on every worker. Failure modes exercise every path
of the isolation layer: a compile error, an invalid config, a kernel that raises, a wrong
answer, a process exit, a real segmentation fault, and hangs while building or running.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import time
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from schedule_templates.errors import CodegenError, InvalidConfigError
from schedule_templates.protocol import ClaimItem
from schedule_templates.records import MeasureOptions
from schedule_templates.workloads import parse_workload
from workers.backends.base import Backend, BoundKernel, Decoded, resolve

#: ``poison`` raises like ``runtime_error`` and leaves the backend unusable (a GPU launch fault)
FAULT_MODES = ("invalid", "compile_error", "runtime_error", "wrong", "exit", "segfault",
               "hang_build", "hang_run", "poison")
#: the device class a fake worker reports unless told to simulate another one
FAKE_DEVICE_CLASS = "cpu:fake:simulated:simulated:fake:1c"
#: a hang lasts this long; the measurer's timeouts are far shorter
HANG_S = 3600.0


class FakeKernelError(RuntimeError):
    """What a fake kernel in ``runtime_error`` mode raises."""


class FakeBackend(Backend):
    """Options: ``rates`` (mode -> probability), ``faults`` (config index -> mode, wins over
    rates), ``validate`` (check configs against the real templates), ``peak_gflops``,
    ``noise`` (relative spread of samples), ``compile_s`` / ``run_s`` (simulated durations),
    ``start_s`` (a simulated slow start: the backend's construction sleeps that long),
    ``device_class`` (the class id a worker with this backend reports: simulated hardware),
    ``trace`` (a file that gets one JSON line per 10 ms of simulated building and per timed
    run, with the process, the time and the cores it may use: the pipeline's tests read it)."""

    name = "fake"
    probes_quiet = False  # its costs are drawn, not timed

    def __init__(self, seed: int = 0, rates: Mapping[str, float] | None = None,
                 faults: Mapping[int | str, str] | None = None, validate: bool = True,
                 peak_gflops: float = 100.0, noise: float = 0.01, compile_s: float = 0.0,
                 run_s: float = 0.0, device_class: str | None = None,
                 trace: str | None = None, start_s: float = 0.0) -> None:
        time.sleep(start_s)
        self.seed = seed
        self.device_class = device_class
        self.rates = dict(rates or {})
        self.faults = {int(k): v for k, v in (faults or {}).items()}
        for mode in [*self.rates, *self.faults.values()]:
            if mode not in FAULT_MODES:
                raise ValueError(f"unknown fault mode {mode!r}; known: {', '.join(FAULT_MODES)}")
        if sum(self.rates.values()) > 1.0:
            raise ValueError("fault rates add up to more than 1")
        self.validate = validate
        self.peak_gflops = peak_gflops
        self.noise = noise
        self.compile_s = compile_s
        self.run_s = run_s
        self.trace = trace
        self._poisoned = False

    @classmethod
    def declared_device_class(cls, options: dict[str, Any]) -> str | None:
        # never the host's class: drawn costs must not mix with the host's real measurements
        declared = options.get("device_class")
        return str(declared) if declared else FAKE_DEVICE_CLASS

    def healthy(self) -> bool:
        return not self._poisoned

    def check(self, task: ClaimItem) -> Decoded | None:
        resolved = resolve(task) if self.validate else None
        if resolved is None:
            parse_workload(task.candidate.workload)  # a malformed key is refused unvalidated too
        if self.mode(task, resolved) == "invalid":
            raise InvalidConfigError(f"fake: config {config_index(task, resolved)} is invalid")
        return resolved

    def compile(self, task: ClaimItem, resolved: Decoded | None) -> BoundKernel:
        mode = self.mode(task, resolved)
        if mode == "hang_build":
            time.sleep(HANG_S)
        if mode == "compile_error":
            raise CodegenError(f"fake: config {config_index(task, resolved)} does not compile")
        self._sleep_building(self.compile_s)
        self._poisoned = self._poisoned or mode == "poison"
        workload = resolved.workload if resolved else parse_workload(task.candidate.workload)
        rng = self._rng(task, resolved)
        gflops = self.peak_gflops * max(1e-3, float(rng.uniform()) ** 2)
        return FakeKernel(mode, workload.flops() / (gflops * 1e9), rng)

    def run(self, kernel: BoundKernel, options: MeasureOptions) -> tuple[float, ...]:
        assert isinstance(kernel, FakeKernel)
        kernel.run()  # the warm-up: a crashing mode crashes here even without a check
        start = time.monotonic()
        time.sleep(self.run_s)
        self._record({"phase": "time", "start": start, "end": time.monotonic()})
        return kernel.samples(max(1, options.repeat), self.noise)

    def _sleep_building(self, seconds: float) -> None:
        if self.trace is None:
            time.sleep(seconds)
            return
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self._record({"phase": "build", "at": time.monotonic()})
            time.sleep(min(0.01, left))

    def _record(self, event: dict[str, Any]) -> None:
        if self.trace is None:
            return
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        with open(self.trace, "a", encoding="utf-8") as f:
            f.write(json.dumps({**event, "pid": os.getpid(), "cpus": cpus}) + "\n")

    def measure_peak(self, threads: int) -> float | None:
        return self.peak_gflops * threads

    def mode(self, task: ClaimItem, resolved: Decoded | None) -> str:
        index = config_index(task, resolved)
        if index in self.faults:
            return self.faults[index]
        draw = float(self._rng(task, resolved, stream=1).uniform())
        for mode in FAULT_MODES:
            draw -= self.rates.get(mode, 0.0)
            if draw < 0.0:
                return mode
        return "ok"

    def _rng(self, task: ClaimItem, resolved: Decoded | None, stream: int = 0
             ) -> np.random.Generator:
        workload = zlib.crc32(task.candidate.workload.encode())
        return np.random.default_rng([self.seed, workload, config_index(task, resolved), stream])


def config_index(task: ClaimItem, resolved: Decoded | None) -> int:
    if resolved is not None:
        return resolved.config.index
    index = task.candidate.index
    if index is not None and index >= 0:
        return index
    return zlib.crc32(json.dumps(dict(task.candidate.config), sort_keys=True).encode())


class FakeKernel:
    reduction_length = 1

    def __init__(self, mode: str, cost_s: float, rng: np.random.Generator) -> None:
        self.mode = mode
        self.cost_s = cost_s
        self._rng = rng
        self._expected = np.arange(8, dtype=np.float32)
        self._output = np.zeros(8, dtype=np.float32)

    def run(self) -> None:
        if self.mode in ("runtime_error", "poison"):
            raise FakeKernelError(f"fake: the kernel raised ({self.mode})")
        if self.mode == "exit":
            os._exit(3)
        if self.mode == "segfault":
            ctypes.string_at(0)  # reads address 0: a real SIGSEGV
        if self.mode == "hang_run":
            time.sleep(HANG_S)
        self._output[:] = self._expected + (1.0 if self.mode == "wrong" else 0.0)

    @property
    def output(self) -> np.ndarray:
        return self._output

    def expected(self) -> np.ndarray:
        return self._expected

    def samples(self, repeat: int, noise: float) -> tuple[float, ...]:
        spread = self._rng.normal(0.0, noise, size=repeat)
        return tuple(max(self.cost_s * 1e-3, self.cost_s * (1.0 + float(s))) for s in spread)

    def close(self) -> None:
        """Nothing to free."""


def parse_rates(text: str) -> dict[str, float]:
    """``"wrong=0.05,segfault=0.01"`` -> rates, as the CLI spells them."""
    rates: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        mode, sep, value = part.partition("=")
        if not sep or mode.strip() not in FAULT_MODES:
            raise ValueError(f"expected MODE=RATE with MODE in {', '.join(FAULT_MODES)}: {part!r}")
        rate = float(value)
        if not 0.0 <= rate <= 1.0 or math.isnan(rate):
            raise ValueError(f"rate for {mode} must be in [0, 1]: {value!r}")
        rates[mode.strip()] = rate
    return rates
