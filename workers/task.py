"""A claimed work item, parsed from the protocol's ``item`` object."""

from __future__ import annotations

import dataclasses
from typing import Any

from schedule_templates.records import MeasureOptions
from workers.errors import ProtocolError

MeasureId = int | str


@dataclasses.dataclass(frozen=True)
class MeasureTask:
    """What to measure: names only, never code (the worker lowers templates it trusts)."""

    measure_id: MeasureId
    template: str
    workload: str
    target: str
    config: dict[str, Any]
    options: MeasureOptions = dataclasses.field(default_factory=MeasureOptions)
    threads: int = 1
    template_version: int | None = None

    @classmethod
    def from_item(cls, item: Any) -> MeasureTask:
        """Parse one claimed item; raises ProtocolError naming what is malformed."""
        if not isinstance(item, dict):
            raise ProtocolError(f"an item must be an object, got {type(item).__name__}")
        measure_id = item.get("measure_id")
        if not isinstance(measure_id, int | str) or isinstance(measure_id, bool):
            raise ProtocolError(f"item has no valid measure_id: {measure_id!r}")
        try:
            return cls(
                measure_id=measure_id,
                template=_text(item, "template"),
                workload=_text(item, "workload"),
                target=_text(item, "target"),
                config=_config(item.get("config")),
                options=MeasureOptions.from_json(item.get("options") or {}),
                threads=_positive_int(item.get("threads", 1), "threads"),
                template_version=_optional_int(item.get("template_version")),
            )
        except (TypeError, ValueError) as e:
            raise ProtocolError(f"item {measure_id!r}: {e}") from e

    @staticmethod
    def measure_id_of(item: Any) -> MeasureId | None:
        """The id of a possibly malformed item, so that it can still be answered."""
        if isinstance(item, dict):
            value = item.get("measure_id")
            if isinstance(value, int | str) and not isinstance(value, bool):
                return value
        return None


def _text(item: dict[str, Any], name: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise ValueError(f"field {name!r} must be a non-empty string, got {value!r}")
    return value


def _config(value: Any) -> dict[str, Any]:
    if isinstance(value, int) and not isinstance(value, bool):
        return {"index": value}
    if not isinstance(value, dict):
        raise ValueError(f"field 'config' must be an object, got {value!r}")
    return value


def _positive_int(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"field {name!r} must be a positive integer, got {value!r}")
    return value


def _optional_int(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"field 'template_version' must be an integer, got {value!r}")
    return value
