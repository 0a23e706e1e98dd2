"""Finding templates and spaces for the server, with the failures callers expect as data."""

from __future__ import annotations

import logging
from typing import Any

from schedule_templates.errors import InvalidConfigError, ScheduleError
from schedule_templates.space import Config, ConfigSpace
from schedule_templates.workloads import Workload, parse_workload

logger = logging.getLogger(__name__)


def template_for(op: str, target: str) -> Any | None:
    """The template for ``op`` on ``target``, or None when there is none."""
    from schedule_templates.templates.base import get_template

    try:
        return get_template(op, target)
    except ScheduleError:
        return None


def template_named(name: str) -> Any:
    from schedule_templates.templates.base import template_by_name

    return template_by_name(name)


class SpaceCache:
    """Spaces built once per (template, workload) within one request or driver step."""

    def __init__(self) -> None:
        self._spaces: dict[tuple[str, str], tuple[Any, Workload, ConfigSpace]] = {}

    def get(self, template_name: str, workload_key: str) -> tuple[Any, Workload, ConfigSpace]:
        key = (template_name, workload_key)
        if key not in self._spaces:
            template = template_named(template_name)
            workload = parse_workload(workload_key)
            self._spaces[key] = (template, workload, template.space(workload))
        return self._spaces[key]

    def validate(self, template_name: str, version: int, workload_key: str,
                 config: Any) -> Config:
        """Decode ``config`` against the template's space; raise a ScheduleError if invalid."""
        template, workload, space = self.get(template_name, workload_key)
        if int(template.version) != int(version):
            raise InvalidConfigError(
                f"template {template_name} is at version {template.version}, record has {version}"
            )
        decoded = space.from_json(config)
        template.check(workload, decoded)
        return decoded
