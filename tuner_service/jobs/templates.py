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
    """Spaces built once per (template, workload): within one request or driver step, or for
    a server's lifetime (claims validate every config they hand out, and building a space
    costs far more than the claim's own statements).

    Safe to share between request threads: an entry is immutable once stored, and two threads
    building the same one at once store equal values. Past ``max_entries`` it starts over, so
    a long-lived server's memory stays bounded whatever its jobs' workloads."""

    def __init__(self, max_entries: int = 4096) -> None:
        self._spaces: dict[tuple[str, str], tuple[Any, Workload, ConfigSpace]] = {}
        self._max_entries = max_entries

    def get(self, template_name: str, workload_key: str) -> tuple[Any, Workload, ConfigSpace]:
        key = (template_name, workload_key)
        found = self._spaces.get(key)
        if found is None:
            template = template_named(template_name)
            workload = parse_workload(workload_key)
            found = (template, workload, template.space(workload))
            if len(self._spaces) >= self._max_entries:
                self._spaces = {}
            self._spaces[key] = found
        return found

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
