"""Transfer across workloads (``xgb-transfer``): other workloads' measurements as a prior.

A task starts with records of the same template and target measured on other workloads (the
shared log, or a records file). The loop-nest features mean the same thing across shapes, so a
model trained on them ranks this workload's configs before any of them is measured. The prior
enters every fit as extra groups (one per workload) whose weight

    prior_weight x relevance x half_life / (half_life + own measurements)

decays as the task's own measurements arrive (and leaves the fits once under ``min_share``,
so late refits cost what plain ``xgb``'s do). ``relevance`` guards against an unlike workload:
once ``min_own`` configs of this task have run, a model trained on the prior alone must rank
them better than chance, else the prior is switched off and the tuner is plain ``xgb``. With no
records at all it is ``xgb``, proposal for proposal.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from schedule_templates.errors import ScheduleError
from schedule_templates.features import FeatureExtractor
from schedule_templates.records import ErrorKind, MeasureResult
from schedule_templates.space import Config, ConfigSpace
from schedule_templates.workloads import Workload, parse_workload
from tuner_service.cost_model import XGBCostModel, normalise, pairwise_accuracy, throughputs
from tuner_service.tuners.model_based import ModelTuner, TrainingSet

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TransferRecord:
    """One measured config of some workload (on the tuner's target); records of templates other
    than the tuner's are ignored."""

    workload: str  # workload key
    template: str  # template name, e.g. ``conv2d.x86``
    index: int
    result: MeasureResult


@dataclasses.dataclass(frozen=True)
class TransferParams:
    prior_weight: float = 1.0
    #: own measurements at which the prior's weight has halved
    half_life: int = 64
    #: own measurements needed before the prior's relevance is judged
    min_own: int = 16
    #: prior pairwise accuracy on own data at or below which the prior is dropped, and above
    #: which it counts fully (linear in between)
    chance: float = 0.55
    trusted: float = 0.7
    #: records kept (a seeded sample spread evenly over workloads) to bound fitting time
    max_records: int = 2000
    #: below this share the prior leaves the fits (it no longer changes them, but costs time)
    min_share: float = 0.1


class TransferTuner(ModelTuner):
    def __init__(self, workload: Workload, space: ConfigSpace, seed: int = 0, *,
                 transfer: Iterable[TransferRecord] = (),
                 transfer_params: TransferParams | None = None, **options: Any) -> None:
        super().__init__(workload, space, seed, **options)
        self.transfer_params = transfer_params or TransferParams()
        name = self.extractor.template.name
        self._records = [r for r in transfer if r.template == name]
        self._prior: TrainingSet | None = None
        self._prior_model: XGBCostModel | None = None
        self._prepared = not self._records
        #: the prior's current weight multiplier (1 before judging, 0 once found unlike)
        self.relevance = 1.0

    def _prepare(self) -> None:
        """Featurise the records once, lazily (a server builds tuners inside a transaction)."""
        if self._prepared:
            return
        self._prepared = True
        self._prior = prior_training_set(self.extractor, self._records,
                                         self.transfer_params.max_records, self.rng)
        self._records = []

    def _propose(self, n: int) -> list[int]:
        self._prepare()
        if self._prior is not None and not self.model.trained:
            self.refit()  # nothing measured yet: the model is the prior alone
        return super()._propose(n)

    def _update(self, indices: Sequence[int], results: Sequence[MeasureResult]) -> None:
        self._prepare()
        super()._update(indices, results)

    def prior_share(self) -> float:
        p = self.transfer_params
        return p.prior_weight * self.relevance * p.half_life / (p.half_life + len(self._rows))

    def training_set(self) -> TrainingSet | None:
        own = self.own_training_set()
        if self._prior is None:
            return own
        self._judge_prior()
        share = self.prior_share()
        if share < self.transfer_params.min_share:
            return own
        x, y, g, w = self._prior
        prior = (x, y, g + 1, w * share)  # own data is group 0
        return prior if own is None else stack([own, prior])

    def _judge_prior(self) -> None:
        p = self.transfer_params
        own = self.own_training_set()
        if self._prior is None or own is None or len(own[1]) < p.min_own:
            return
        if self._prior_model is None:  # fitted once, on the prior alone
            self._prior_model = XGBCostModel(self.model.params)
            self._prior_model.fit(*self._prior)
        accuracy = pairwise_accuracy(own[1], self._prior_model.predict(own[0]))
        self.relevance = float(np.clip((accuracy - p.chance) / (p.trusted - p.chance), 0, 1))
        logger.debug("prior ranks own data with accuracy %.3f: relevance %.2f",
                     accuracy, self.relevance)


def prior_training_set(extractor: FeatureExtractor, records: Sequence[TransferRecord],
                       max_records: int, rng: np.random.Generator) -> TrainingSet | None:
    """Features and per-workload normalised throughput of the records, one group per workload;
    records of the tuner's own workload count too (an earlier job measured them)."""
    by_workload: dict[str, list[TransferRecord]] = defaultdict(list)
    for record in records:
        by_workload[record.workload].append(record)
    quota = max(1, max_records // max(1, len(by_workload)))
    parts: list[TrainingSet] = []
    for group, key in enumerate(sorted(by_workload)):
        chosen = by_workload[key]
        if len(chosen) > quota:
            keep = sorted(rng.choice(len(chosen), quota, replace=False).tolist())
            chosen = [chosen[i] for i in keep]
        part = _featurise(extractor, key, chosen, group)
        if part is not None:
            parts.append(part)
    return stack(parts) if parts else None


def stack(parts: Sequence[TrainingSet]) -> TrainingSet:
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]), np.concatenate([p[3] for p in parts]))


def _featurise(extractor: FeatureExtractor, key: str, records: Sequence[TransferRecord],
               group: int) -> TrainingSet | None:
    try:
        workload = parse_workload(key)
        if workload.key == extractor.workload.key:
            other = extractor
        else:
            other = FeatureExtractor(extractor.template, workload, knobs=extractor.knobs)
    except ScheduleError as e:
        logger.warning("transfer records of %s skipped: %s", key, e)
        return None
    if other.width != extractor.width:
        logger.warning("transfer records of %s skipped: %d features, expected %d",
                       key, other.width, extractor.width)
        return None
    rows, values = [], []
    for record, value in zip(records, throughputs([r.result for r in records]), strict=True):
        try:
            row = other.row(record.index)
        except ScheduleError:  # an index outside this space: a record of another version
            row = None
        if row is not None:
            rows.append(row)
            values.append(value)
    y = np.asarray(values)
    if len(y) < 2 or y.max(initial=0.0) <= 0:
        return None
    return np.stack(rows), normalise(y), np.full(len(y), group, dtype=np.int64), np.ones(len(y))


def parse_records(lines: Iterable[str], template: str, target: str | None = None,
                  version: int | None = None) -> list[TransferRecord]:
    """Records of ``template`` (at ``version`` and on ``target`` when given) from JSON lines
    in the format of ``GET /api/v1/records`` / ``tuner tune --save-records`` or AutoTVM-style
    logs (``tuner fetch --format autotvm``). Lines of other templates, targets or versions are
    skipped; a malformed line raises ValueError naming its number."""
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = _parse_line(json.loads(line), template, target, version)
        except (ValueError, TypeError, KeyError, IndexError) as e:
            raise ValueError(f"line {number}: not a measurement record ({e})") from e
        if record is not None:
            out.append(record)
    return out


def _parse_line(data: Any, template: str, target: str | None, version: int | None
                ) -> TransferRecord | None:
    if "input" in data:  # AutoTVM: input [target, template, [workload], {}], result [costs, err]
        line_target, line_template, args = data["input"][0], data["input"][1], data["input"][2]
        key, costs, error = args[0], data["result"][0], data["result"][1]
        result = MeasureResult(tuple(float(c) for c in costs), ErrorKind(int(error)))
    else:
        line_target, line_template, key = data["target"], data["template"], data["workload"]
        result = MeasureResult.from_json(data["result"])
    if line_template != template or (target is not None and line_target != target):
        return None
    if version is not None and int(data.get("template_version", version)) != version:
        return None
    config = data["config"]
    index = config["index"] if isinstance(config, dict) else config
    if not isinstance(index, int) or isinstance(index, bool):
        raise ValueError(f"config index {index!r} is not an integer")
    return TransferRecord(str(key), str(line_template), index, result)


def record_json(workload: str, template: Any, target: str, config: Config,
                result: MeasureResult) -> dict[str, Any]:
    """One measurement in the records format ``parse_records`` reads (and the server imports)."""
    return {"workload": workload, "target": target, "template": template.name,
            "template_version": int(template.version), "config": config.to_json(),
            "result": result.to_json()}
