"""Measurement hygiene: is the machine quiet while a kernel is timed?

Two probes around every timed protocol:

* **load of other processes**: CPU time spent on the measurement cores (the process's affinity
  set when the probe is taken) during the timed run, minus this process's own CPU time, per
  second of wall time, from /proc/stat and /proc/self/stat. A busy loop elsewhere reads
  about 1.0 (one core);
* **frequency drift**: a short fixed reference loop before and after the run; the quicker of
  the two is compared with the median of the last ``REFERENCE_HISTORY`` probes. A core that
  clocked down, or that is shared, runs both slower. Against the fastest loop ever seen, or
  with the slower of the two, a quiet 2-core VM flagged 60-80% of runs (a pure-Python loop right
  after a vector kernel often runs 30-70% slower than its best); this way about 5%.

A run that is not quiet is measured again (``retries`` times at most, after a short pause);
the quietest attempt is kept, and flagged ``noisy`` when none was quiet. While the machine
stays busy (the previous candidate also ended noisy), a run is flagged without measuring it
again: load that outlasts a whole candidate outlasts a retry too, and retries would only slow
the worker down. Off Linux, the load probe reads nothing and only the drift probe judges.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

#: another process using more than this many cores during a timed run makes it noisy
MAX_OTHER_LOAD = 0.25
#: the reference loop running this much slower than its best makes a run noisy
MAX_DRIFT = 0.15
#: timed protocols tried per candidate while the machine is not quiet
DEFAULT_RETRIES = 2
#: pause before measuring again, so a short burst elsewhere can pass
RETRY_PAUSE_S = 0.2
#: a shorter timed run spans too few clock ticks to tell another process's load
MIN_LOAD_WINDOW_S = 0.1
#: probes the drift baseline remembers (a median over them)
REFERENCE_HISTORY = 32
_REFERENCE_ITERATIONS = 20_000
_REFERENCE_RUNS = 3


@dataclasses.dataclass(frozen=True)
class Quietness:
    """What the probes saw during one timed run."""

    other_load: float | None  # cores used by other processes; None when unreadable
    drift: float  # reference loop slow-down against its recent median (0.0 = not slower)

    @property
    def quiet(self) -> bool:
        load_ok = self.other_load is None or self.other_load <= MAX_OTHER_LOAD
        return load_ok and self.drift <= MAX_DRIFT

    def badness(self) -> float:
        """Orders attempts: the quietest has the least."""
        return (self.other_load or 0.0) / MAX_OTHER_LOAD + self.drift / MAX_DRIFT


@dataclasses.dataclass(frozen=True)
class _Snapshot:
    busy: int  # jiffies the measurement cores spent busy
    total: int  # all jiffies of the measurement cores
    own: int  # jiffies of this process (all its threads)


class QuietGauge:
    """Probes for one measuring process (it remembers the fastest reference loop)."""

    def __init__(self, retries: int = DEFAULT_RETRIES, proc: Path = Path("/proc"),
                 cpus: set[int] | None = None) -> None:
        self.retries = max(0, retries)
        self._proc = proc
        #: None: the cores this process may use at each probe (the pool pins a timed child to
        #: the timing cores, and builds run on the others: their load is not this run's)
        self._cpus = cpus
        self._references: collections.deque[float] = collections.deque(maxlen=REFERENCE_HISTORY)
        self._last_quiet = True

    def measure(self, run: Callable[[], tuple[float, ...]]
                ) -> tuple[tuple[float, ...], Quietness, int]:
        """Run the timed protocol until a quiet attempt (or out of retries); returns the
        costs of the quietest attempt, what the probes saw, and the attempts made."""
        best: tuple[tuple[float, ...], Quietness] | None = None
        attempts = 0
        for attempt in range((self.retries if self._last_quiet else 0) + 1):
            if attempt:
                time.sleep(RETRY_PAUSE_S)
            attempts += 1
            costs, seen = self.probe(run)
            if best is None or seen.badness() < best[1].badness():
                best = (costs, seen)
            if seen.quiet:
                break
            logger.debug("noisy run (other load %s, drift %.0f%%); measuring again",
                         seen.other_load, seen.drift * 100)
        assert best is not None
        self._last_quiet = best[1].quiet
        return best[0], best[1], attempts

    def probe(self, run: Callable[[], tuple[float, ...]]) -> tuple[tuple[float, ...], Quietness]:
        """One timed protocol between the probes."""
        baseline = self._baseline()
        before_ref = self.reference_s()
        start, wall = self.snapshot(), time.monotonic()
        costs = run()
        end, wall = self.snapshot(), time.monotonic() - wall
        after_ref = self.reference_s()
        drift = min(before_ref, after_ref) / (baseline or min(before_ref, after_ref)) - 1.0
        return costs, Quietness(other_load(start, end, wall), max(0.0, drift))

    def reference_s(self) -> float:
        """Seconds of the reference loop (best of a few), remembered for the baseline."""
        times = []
        for _ in range(_REFERENCE_RUNS):
            begin = time.perf_counter()
            _reference_loop(_REFERENCE_ITERATIONS)
            times.append(time.perf_counter() - begin)
        best = min(times)
        self._references.append(best)
        return best

    def _baseline(self) -> float | None:
        """The median of the remembered probes (None before any)."""
        return statistics.median(self._references) if self._references else None

    def snapshot(self) -> _Snapshot | None:
        """CPU counters now; None where /proc cannot be read."""
        try:
            stat = (self._proc / "stat").read_text()
            own = (self._proc / "self" / "stat").read_text()
        except OSError:
            return None
        cpus = self._cpus
        if cpus is None:
            cpus = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()
        return parse_snapshot(stat, own, cpus)


def parse_snapshot(stat: str, self_stat: str, cpus: set[int]) -> _Snapshot | None:
    """Busy and total jiffies of ``cpus`` from /proc/stat, and the process's own jiffies."""
    busy = total = 0
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or (cpus and int(name[3:]) not in cpus):
            continue
        # user nice system idle iowait irq softirq steal (guest time is already in user)
        values = [int(v) for v in rest.split()[:8]]
        values += [0] * (8 - len(values))
        idle = values[3] + values[4]
        total += sum(values)
        busy += sum(values) - idle
    # the command name may hold spaces: fields after its closing parenthesis
    fields = self_stat.rpartition(")")[2].split()
    if total == 0 or len(fields) < 15:
        return None
    own = sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return _Snapshot(busy, total, own)


def other_load(start: _Snapshot | None, end: _Snapshot | None, wall_s: float) -> float | None:
    """Cores used by other processes between two snapshots (None when unknown)."""
    if start is None or end is None or wall_s < MIN_LOAD_WINDOW_S:
        return None
    clock = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    others = (end.busy - start.busy) - (end.own - start.own)
    return round(max(0.0, others / clock / wall_s), 3)


def _reference_loop(n: int) -> int:
    acc = 0
    for i in range(n):
        acc = (acc + i * i) & 0xFFFF
    return acc
