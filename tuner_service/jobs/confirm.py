"""Before a task's best reaches the shared log, its top candidates are measured again.

One sample taken while the machine was busy can crown a config that is slower than the
default. So when a task's trials are spent, its ``top`` fastest configs, plus the template
default and the best config already known for the device (both were among its first trials),
are queued again ``rounds`` times, interleaved (a, b, c, a, b, c: a burst of load hits them
alike). Each re-measurement counts by its fastest sample: interference only ever adds time
(measured on a loaded 2-core machine: samples of one 18 us kernel read 18 us, 8.5 ms and 17 ms
in one run), so the fastest sample is the closest to the kernel's own speed. The config with
the lowest median of those over the rounds is stored, with that median as its cost; when the
stored entry's own config was among them and lost, the winner replaces it even if the older
number looked faster. Re-measurements are ``purpose='confirm'``
rows: not trials, never told to the tuner.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import uuid
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from schedule_templates.errors import ScheduleError
from tuner_service.db.models import JobTask, Measurement, TuningLogEntry
from tuner_service.db.states import MeasurementState
from tuner_service.jobs.device import class_columns
from tuner_service.jobs.results import CONFIRM, measurement_result, update_tuning_log

logger = logging.getLogger(__name__)

#: above this share of noisy re-measurements a task's ranking is not trusted (measured on a
#: quiet 2-core VM: about 5% of runs are flagged; under a busy loop beside it, all of them)
MAX_NOISY_SHARE = 0.25


@dataclasses.dataclass(frozen=True)
class ConfirmPolicy:
    #: fastest distinct configs of a task measured again (0: store the best as measured)
    top: int = 3
    #: times each is measured again
    rounds: int = 2

    @property
    def enabled(self) -> bool:
        return self.top > 0 and self.rounds > 0


def start(session: Session, task: Any, target: str, device_key: str | None,
          policy: ConfirmPolicy) -> list[int]:
    """Queue the re-measurements of ``task`` (a ``jobs.run.TaskRun``); their ids."""
    configs = candidates(session, task.job_task_id, policy.top, task.seeds)
    if not policy.enabled or not configs:
        return []
    rows = [Measurement(
        uid=uuid.uuid4().hex, job_task_id=task.job_task_id, config_index=index,
        config=task.space.get(index).to_json(), template=task.template.name,
        template_version=int(task.template.version), workload_key=task.workload_key,
        target=target, device_key=device_key, state=MeasurementState.QUEUED, attempts=0,
        error_message="",        purpose=CONFIRM,
    ) for _round in range(policy.rounds) for index in configs]
    session.add_all(rows)
    session.flush()
    session.execute(update(JobTask).where(JobTask.id == task.job_task_id).values(
        message=f"re-measuring the {len(configs)} best configs {policy.rounds} times"))
    return [r.id for r in rows]


def candidates(session: Session, job_task_id: int, top: int, seeds: Sequence[int]
               ) -> list[int]:
    """The ``top`` fastest configs measured without error, then the seeds (default and best
    known) that also measured without error."""
    best = func.min(Measurement.mean_cost)
    ok = session.execute(
        select(Measurement.config_index, best)
        .where(Measurement.job_task_id == job_task_id, Measurement.purpose != CONFIRM,
               Measurement.state == MeasurementState.DONE, Measurement.mean_cost.is_not(None))
        .group_by(Measurement.config_index).order_by(best, Measurement.config_index)
    ).all()
    chosen = [int(index) for index, _cost in ok[:max(0, top)]]
    measured = {int(index) for index, _cost in ok}
    chosen += [s for s in dict.fromkeys(seeds) if s in measured and s not in chosen]
    return chosen


def finish(session: Session, task: Any, job_id: int) -> str:
    """Store the winner of the re-measurements per (device class, threads) they were taken
    on; without any good re-measurement, the task's best trial as measured. Returns a note
    for the task's message ("" when there is nothing to say)."""
    rows = session.scalars(select(Measurement).where(
        Measurement.job_task_id == task.job_task_id, Measurement.purpose == CONFIRM,
        Measurement.state == MeasurementState.DONE, Measurement.mean_cost.is_not(None))).all()
    groups: dict[tuple[str | None, int | None], list[Measurement]] = defaultdict(list)
    for row in rows:
        groups[(row.device_class, row.threads)].append(row)
    if not groups:
        _store_unconfirmed(session, task.job_task_id, job_id)
        return ""
    largest, message = max(groups.values(), key=len), ""
    for group in groups.values():
        chosen, cost, note = _store_group(session, task, job_id, group)
        if group is largest:
            session.execute(update(JobTask).where(JobTask.id == task.job_task_id).values(
                best_cost=cost, best_measurement_id=chosen.id))
            logger.info("job %d: %s stores config %d (%.4g ms)%s", job_id, task.workload_key,
                        chosen.config_index, cost * 1e3, f"; {note}" if note else "")
            message = note
    return message


def _store_group(session: Session, task: Any, job_id: int, group: list[Measurement]
                 ) -> tuple[Measurement, float, str]:
    """Store the config a group of re-measurements supports; the row standing for it, its
    cost, and a note when the machine was too busy to trust them.

    On a busy machine the numbers rank configs by how they suffer from the load, not by their
    speed (measured: a config stored that way ran 2x slower than the default once the machine
    was quiet). So when more than ``MAX_NOISY_SHARE`` of the re-measurements were noisy, the
    config already stored for this device, else the template default, is kept; otherwise the
    quiet re-measurements alone decide (a stray noisy one is left out, not allowed to veto).
    """
    by_config: dict[int, list[Measurement]] = defaultdict(list)
    for row in group:
        by_config[row.config_index].append(row)
    stored = _stored_config(session, group[0], task)
    noisy = sum(bool(row.noisy) for row in group)
    quiet = {index: [r for r in rows if not r.noisy] for index, rows in by_config.items()}
    quiet = {index: rows for index, rows in quiet.items() if rows}
    if noisy > MAX_NOISY_SHARE * len(group) or not quiet:
        default = task.seeds[0] if task.seeds else None
        safe = next((i for i in (stored, default) if i is not None and i in by_config), None)
        if safe is not None:
            chosen, cost, spread = _summary(by_config[safe])
            if safe != stored:  # nothing kept for this device: the default, unverified
                update_tuning_log(session, chosen, job_id, mean_cost=cost, spread=spread)
            kept = "stored" if safe == stored else "default"
            return chosen, cost, (f"the machine was busy while re-measuring: kept the {kept} "
                                  "config; tune again on a quiet machine")
    # every re-measurement noisy and neither the stored config nor the default among them (its
    # re-measurements failed): the noisy ones decide, and the config is stored unconfirmed
    deciding = quiet or by_config
    medians = {index: _summary(rows)[1] for index, rows in deciding.items()}
    chosen, cost, spread = _summary(deciding[min(medians, key=lambda i: (medians[i], i))])
    update_tuning_log(session, chosen, job_id, mean_cost=cost, spread=spread,
                      confirmed=bool(quiet), force=stored in deciding)
    note = "" if quiet else ("the machine was busy while re-measuring and the default was not "
                             "re-measured: stored the fastest, unconfirmed; tune again on a "
                             "quiet machine")
    return chosen, cost, note


def _summary(rows: list[Measurement]) -> tuple[Measurement, float, float]:
    """For one config's re-measurements: the row standing for them, the median of their
    fastest samples, and the spread of all their samples."""
    cost = statistics.median(_fastest(r) for r in rows)
    samples = [c for r in rows for c in measurement_result(r).costs]
    spread = (max(samples) - min(samples)) / min(samples) if len(samples) > 1 else 0.0
    return min(rows, key=lambda r: (abs(_fastest(r) - cost), r.id)), cost, spread


def _fastest(row: Measurement) -> float:
    """A re-measurement's fastest sample (its mean when it kept no samples)."""
    costs = measurement_result(row).costs
    return min(costs) if costs else row.mean_cost or 0.0


def _stored_config(session: Session, m: Measurement, task: Any) -> int | None:
    """The config index of the entry ``m`` would replace (None: none, or another space)."""
    columns = class_columns(m.device_class)
    entry = session.scalar(select(TuningLogEntry).where(
        TuningLogEntry.workload_key == m.workload_key, TuningLogEntry.target == m.target,
        TuningLogEntry.device_class == columns["device_class"],
        TuningLogEntry.threads == (m.threads or 1)))
    if entry is None or entry.template != m.template:
        return None
    try:
        return int(task.space.from_json(entry.config).index)
    except (ScheduleError, ValueError, TypeError, KeyError):
        return None


def _store_unconfirmed(session: Session, job_task_id: int, job_id: int) -> None:
    best = session.scalar(
        select(Measurement).where(Measurement.job_task_id == job_task_id,
                                  Measurement.state == MeasurementState.DONE,
                                  Measurement.mean_cost.is_not(None))
        .order_by(Measurement.mean_cost, Measurement.id).limit(1))
    if best is not None:
        update_tuning_log(session, best, job_id)
