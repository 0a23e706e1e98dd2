"""The in-process tuning loop behind ``tuner tune``: ask a batch, measure it, tell the tuner."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from schedule_templates.records import MeasureResult
from schedule_templates.space import Config
from schedule_templates.workloads import Workload
from tuner_service.tuners.base import Tuner

#: measures configs, in order; expected failures come back as results with an error kind
Measure = Callable[[Sequence[Config]], list[MeasureResult]]


@dataclasses.dataclass(frozen=True)
class Trial:
    trial: int  # 1-based position in the tuning run
    config: Config
    result: MeasureResult
    gflops: float


def tune(workload: Workload, tuner: Tuner, trials: int, measure: Measure, batch: int = 8,
         on_trial: Callable[[Trial], None] | None = None,
         initial: Sequence[int] = ()) -> list[Trial]:
    """Run up to ``trials`` measurements (fewer if the space runs out); ``initial`` configs
    (for example the template's default) are measured first and told to the tuner."""
    history: list[Trial] = []
    flops = workload.flops()
    first = [i for i in dict.fromkeys(initial) if tuner.space.is_valid(i)][:trials]
    tuner.exclude(first)
    while len(history) < trials:
        indices = first or tuner.ask(min(batch, trials - len(history)))
        first = []
        if not indices:
            break
        configs = [tuner.space.get(i) for i in indices]
        results = measure(configs)
        tuner.tell(indices, results)
        for config, result in zip(configs, results, strict=True):
            trial = Trial(len(history) + 1, config, result, result.gflops(flops))
            history.append(trial)
            if on_trial is not None:
                on_trial(trial)
    return history


def best_trial(history: Sequence[Trial]) -> Trial | None:
    ok = [t for t in history if t.result.ok]
    return min(ok, key=lambda t: t.result.mean_cost) if ok else None
