"""Finding templates for the server, with the failures callers expect as data."""

from __future__ import annotations

import logging
from typing import Any

from schedule_templates.errors import ScheduleError

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
