"""A task's first candidates: the template default and the best config known for the device.

A tuned config is only worth storing if it beats what a build would use without tuning (the
template default) and what the shared log (or an imported pack) already holds for this kind
of device. Measuring both first, under the same conditions as every trial, lets the
re-measurement at the end (``jobs.confirm``) compare them with the task's own finds.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.orm import Session

from schedule_templates.errors import ScheduleError
from schedule_templates.space import ConfigSpace
from schedule_templates.workloads import Workload
from tuner_service.db.models import Job
from tuner_service.jobs import device

logger = logging.getLogger(__name__)


def known_device(session: Session, job: Job) -> device.DeviceQuery | None:
    """The device class and threads a job measures on, when a worker has told its class."""
    found = device.worker_class(session, job.target, job.device_key)
    if found is None:
        return None
    return device.DeviceQuery(device.parse_class(found), job.threads or 1)


def seed_configs(session: Session, template: Any, workload: Workload, space: ConfigSpace,
                 key: str, target: str, known: device.DeviceQuery | None) -> list[int]:
    """Config indices to measure before the tuner's picks: the default, the best known."""
    seeds = []
    try:
        default = template.default_config(workload)
        seeds.append(int(default.index))
    except ScheduleError as e:
        logger.warning("%s has no usable default config: %s", key, e)
    if known is not None:
        best = _best_known(session, template, workload, space, key, target, known)
        if best is not None and best not in seeds:
            seeds.append(best)
    return [s for s in seeds if 0 <= s < space.size]


def _best_known(session: Session, template: Any, workload: Workload, space: ConfigSpace,
                key: str, target: str, known: device.DeviceQuery) -> int | None:
    found = device.resolve(session, key, target, known)
    if found is None:
        return None
    entry, level = found
    if level not in device.LEVELS or entry.template != template.name or (
            entry.template_version != int(template.version)):
        return None
    try:
        config = space.from_json(entry.config)
        template.check(workload, config)
    except (ScheduleError, ValueError, TypeError, KeyError) as e:
        logger.info("the best known config of %s does not fit this space: %s", key, e)
        return None
    logger.info("%s starts from the best known config (%s match, device class %s)",
                key, level.value, entry.device_class)
    return int(config.index)


def take_seeds(task: Any, n: int) -> list[int]:
    """Up to ``n`` seeds of a ``TaskRun`` not proposed yet (marked as proposed)."""
    picks = [s for s in task.seeds if s not in task.tuner.visited][:max(0, n)]
    task.tuner.exclude(picks)
    return picks
