"""Finding templates for the server, with the failures callers expect as data."""

from __future__ import annotations

from schedule_templates.errors import ScheduleError
from schedule_templates.templates.base import Template, get_template


def template_for(op: str, target: str) -> Template | None:
    """The template for ``op`` on ``target``, or None when there is none."""
    try:
        return get_template(op, target)
    except ScheduleError:
        return None
