"""Typed measurement records shared by the worker, the server and the local tuning loop.

Error kinds keep AutoTVM's numbering so records export to its log format unchanged.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any


class ErrorKind(enum.IntEnum):
    NONE = 0
    INSTANTIATION = 1  # the config is not valid for this workload/template
    COMPILE_HOST = 2
    COMPILE_DEVICE = 3
    RUNTIME = 4  # crashed or raised while running
    WRONG_ANSWER = 5
    BUILD_TIMEOUT = 6
    RUN_TIMEOUT = 7
    UNKNOWN = 8


@dataclasses.dataclass(frozen=True)
class MeasureOptions:
    """The run protocol: one warm-up, then ``repeat`` samples, each the mean of ``number`` runs;
    ``number`` grows until one sample lasts at least ``min_repeat_ms``."""

    number: int = 1
    repeat: int = 3
    min_repeat_ms: float = 50.0
    flush_cache: bool = False
    build_timeout_s: float = 20.0
    run_timeout_s: float = 20.0
    check_correctness: bool = True

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MeasureOptions:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})


@dataclasses.dataclass(frozen=True)
class MeasureResult:
    """What one measured candidate produced. ``costs`` is empty unless ``error`` is NONE."""

    costs: tuple[float, ...]  # seconds of one run, one entry per sample
    error: ErrorKind = ErrorKind.NONE
    error_message: str = ""
    compile_time_s: float = 0.0
    wall_time_s: float = 0.0
    #: the machine was not quiet during the kept timed run (another process's load or a
    #: frequency drift), even after measuring again
    noisy: bool = False
    #: cores used by other processes during the kept timed run (None: not probed)
    load: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is ErrorKind.NONE and bool(self.costs)

    @property
    def mean_cost(self) -> float:
        return sum(self.costs) / len(self.costs) if self.costs else math.inf

    @property
    def spread(self) -> float:
        """(slowest - fastest) / fastest sample; 0.0 with fewer than two samples."""
        if len(self.costs) < 2 or min(self.costs) <= 0:
            return 0.0
        return (max(self.costs) - min(self.costs)) / min(self.costs)

    def gflops(self, flops: int) -> float:
        return flops / self.mean_cost / 1e9 if self.ok else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "costs": list(self.costs),
            "error_kind": int(self.error),
            "error_message": self.error_message,
            "compile_time_s": self.compile_time_s,
            "wall_time_s": self.wall_time_s,
            "spread": self.spread,
            "noisy": self.noisy,
            "load": self.load,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MeasureResult:
        return cls(
            costs=tuple(float(c) for c in data.get("costs", ())),
            error=ErrorKind(int(data.get("error_kind", 0))),
            error_message=str(data.get("error_message", "")),
            compile_time_s=float(data.get("compile_time_s", 0.0)),
            wall_time_s=float(data.get("wall_time_s", 0.0)),
            noisy=bool(data.get("noisy", False)),
            load=_load(data.get("load")),
        )

    @classmethod
    def failure(cls, error: ErrorKind, message: str, **times: float) -> MeasureResult:
        # Messages travel to the server and the dashboard: keep them bounded.
        return cls(costs=(), error=error, error_message=message[-2000:],
                   compile_time_s=times.get("compile_time_s", 0.0),
                   wall_time_s=times.get("wall_time_s", 0.0))


def _load(value: object) -> float | None:
    """A probed load: a finite, non-negative number of cores, else unknown."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    load = float(value)
    return load if math.isfinite(load) and load >= 0 else None
