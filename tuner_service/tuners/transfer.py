"""Transfer across workloads (``xgb-transfer``): other workloads' measurements as a prior.

A task starts with records of the same template and target measured on other workloads (the
shared log, or a records file). This module reads them (``parse_records``) and featurises them
into the prior's training set (``prior_training_set``); ``cost_model.TransferCostModel`` weighs
the prior against the task's own measurements. With no records of the template the tuner is
plain ``xgb``, proposal for proposal.
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
from schedule_templates.space import Config
from schedule_templates.workloads import parse_workload
from tuner_service.cost_model import TrainingSet, normalise, stack, throughputs

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TransferRecord:
    """One measured config of some workload (on the tuner's target); records of templates other
    than the tuner's are ignored."""

    workload: str  # workload key
    template: str  # template name, e.g. ``conv2d.x86``
    index: int
    result: MeasureResult


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
