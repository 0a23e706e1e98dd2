"""Task schedulers: how a job's measurement slots are shared among its tasks.

A scheduler is a strategy only (no database, no timing): given each task's remaining budget and
what it has in flight, it says how many new configs to ask from which task's tuner.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class TaskLoad:
    remaining: int  # trials of budget not yet measured or in flight
    in_flight: int


class TaskScheduler(ABC):
    @abstractmethod
    def allocate(self, tasks: Sequence[TaskLoad], capacity: int, batch_size: int
                 ) -> list[tuple[int, int]]:
        """(task position, how many to ask) pairs using at most ``capacity`` slots in total;
        a task never gets more than its remaining budget or more than ``batch_size`` in flight."""


class RoundRobinScheduler(TaskScheduler):
    """Gives a batch to each task in turn, starting after the last task served."""

    def __init__(self) -> None:
        self._cursor = 0

    def allocate(self, tasks: Sequence[TaskLoad], capacity: int, batch_size: int
                 ) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        count, start = len(tasks), self._cursor
        for step in range(count):
            if capacity <= 0:
                break
            position = (start + step) % count
            load = tasks[position]
            want = min(batch_size - load.in_flight, load.remaining, capacity)
            if want > 0:
                out.append((position, want))
                capacity -= want
                self._cursor = (position + 1) % count
        return out


def make_scheduler(name: str = "round-robin") -> TaskScheduler:
    factories = {"round-robin": RoundRobinScheduler}
    try:
        return factories[name]()
    except KeyError:
        raise ValueError(f"unknown task scheduler {name!r}") from None
