"""Measure configs of one workload in child processes (a bad kernel costs one result)."""

from __future__ import annotations

from collections.abc import Sequence

from schedule_templates.protocol import Candidate, ClaimItem, Target
from schedule_templates.records import MeasureOptions, MeasureResult
from schedule_templates.space import Config


class IsolatedMeasure:
    """A ``Measure`` callable for the local loop, backed by the worker's isolated measurer."""

    def __init__(self, key: str, template: str, target: str, threads: int,
                 options: MeasureOptions) -> None:
        from workers.backends import BackendSpec
        from workers.measure import IsolatedMeasurer

        self._key, self._template, self._threads = key, template, threads
        self._options = options
        self._target = Target.parse(target)
        self._measurer = IsolatedMeasurer(BackendSpec(self._target.kind), parallel_build=1)
        self._next_id = 0

    def __enter__(self) -> IsolatedMeasure:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._measurer.close()

    def __call__(self, configs: Sequence[Config]) -> list[MeasureResult]:
        tasks = []
        for config in configs:
            self._next_id += 1
            candidate = Candidate(self._template, self._key, config.to_json())
            tasks.append(ClaimItem(self._next_id, candidate, self._target, self._options,
                                   self._threads))
        results = {t.measure_id: r for t, r in self._measurer.measure_many(tasks)}
        return [results[t.measure_id] for t in tasks]
