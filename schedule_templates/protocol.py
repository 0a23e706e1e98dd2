"""The typed candidate protocol shared by the server and its workers (docs/worker-protocol.md).

One type per thing that crosses a process boundary, decoded there once and trusted by type after:

- ``Target`` (``target.py``, re-exported here): a target string parsed into its kind (``llvm``,
  ``cuda``) and its options (``-mcpu=znver4``, ``-arch=sm_90``).
- ``Candidate``: what to build, by name only (template, template version, workload key, config);
  ``decode`` checks it against this process's own templates.
- ``ClaimItem``: one claimed candidate with its measure id, target, run options and threads.
- ``Report``: one measured result as a worker sends it back.

The JSON of ``ClaimItem`` and ``Report`` is the wire format the previous worker release speaks
(same field names and shapes), so no version field is needed. Plain dataclasses, standard library
only: a worker imports this without the server's dependencies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from schedule_templates.errors import InvalidConfigError, MessageError
from schedule_templates.records import MeasureOptions, MeasureResult
from schedule_templates.target import Target
from schedule_templates.templates.base import template_by_name
from schedule_templates.workloads import parse_workload

if TYPE_CHECKING:
    from schedule_templates.space import Config
    from schedule_templates.templates.base import Template
    from schedule_templates.workloads import Workload

#: a measurement's id: the server's are integers, test servers may use text
MeasureId = int | str


@dataclasses.dataclass(frozen=True)
class Decoded:
    """A candidate checked against this process's templates."""

    workload: Workload
    template: Template
    config: Config


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One point to build, by name: the worker lowers it with templates it trusts.

    ``config`` is the config's JSON (``{"index": i, "entity": [...]}``): the index names the
    point and the entities let the receiver check that its space still means the same point.
    ``template_version`` None means whatever version the receiver has (local callers)."""

    template: str
    workload: str
    config: Mapping[str, Any]
    template_version: int | None = None

    @classmethod
    def of(cls, template: Template, workload: Workload, config: Config) -> Candidate:
        """The candidate of objects this process holds (a config of the template's space)."""
        return cls(template.name, workload.key, config.to_json(), int(template.version))

    @property
    def index(self) -> int | None:
        index = self.config.get("index") if isinstance(self.config, Mapping) else None
        return index if isinstance(index, int) and not isinstance(index, bool) else None

    def decode(self) -> Decoded:
        """Parse the workload, find the template and check the config against its space;
        InvalidConfigError / InvalidWorkloadError name what does not fit."""
        workload = parse_workload(self.workload)
        template = template_by_name(self.template)
        if workload.op != template.op:
            raise InvalidConfigError(
                f"template {template.name} handles {template.op}, not {workload.op}")
        if self.template_version is not None and self.template_version != template.version:
            raise InvalidConfigError(
                f"template {template.name} is version {template.version} here, "
                f"the candidate is for version {self.template_version}")
        config = template.cached_space(workload).from_json(self.config)
        template.check(workload, config)
        return Decoded(workload, template, config)


@dataclasses.dataclass(frozen=True)
class ClaimItem:
    """One claimed candidate, as the server hands it out (the protocol's ``item``)."""

    measure_id: MeasureId
    candidate: Candidate
    target: Target
    options: MeasureOptions = dataclasses.field(default_factory=MeasureOptions)
    threads: int = 1

    def to_json(self) -> dict[str, Any]:
        c = self.candidate
        return {"measure_id": self.measure_id, "template": c.template,
                "template_version": c.template_version, "workload": c.workload,
                "target": str(self.target), "config": dict(c.config),
                "options": self.options.to_json(), "threads": self.threads}

    @classmethod
    def from_json(cls, item: Any) -> ClaimItem:
        """Decode one item; MessageError names what is malformed."""
        measure_id = measure_id_of(item)
        if measure_id is None:
            raise MessageError(f"item has no valid measure_id: {item!r:.200}")
        try:
            candidate = Candidate(_text(item, "template"), _text(item, "workload"),
                                  _config(item.get("config")),
                                  _optional_int(item.get("template_version")))
            return cls(measure_id, candidate, Target.parse(_text(item, "target")),
                       MeasureOptions.from_json(item.get("options") or {}),
                       _positive_int(item.get("threads", 1), "threads"))
        except (TypeError, ValueError) as e:
            raise MessageError(f"item {measure_id!r}: {e}") from e


def measure_id_of(item: Any) -> MeasureId | None:
    """The id of a possibly malformed item, so that it can still be answered."""
    if isinstance(item, dict):
        value = item.get("measure_id")
        if isinstance(value, int | str) and not isinstance(value, bool):
            return value
    return None


@dataclasses.dataclass(frozen=True)
class Report:
    """One measured result as a worker reports it (the protocol's ``result``).

    ``peak_gflops``, ``device_class``, ``threads`` and ``timings`` are context: what the worker
    measured with and where its time went; the server drops an unreadable one, never the
    result."""

    measure_id: MeasureId
    result: MeasureResult
    peak_gflops: float | None = None
    device_class: str | None = None
    threads: int | None = None
    timings: Mapping[str, float] | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"measure_id": self.measure_id, **self.result.to_json(),
               "peak_gflops": self.peak_gflops, "device_class": self.device_class,
               "threads": self.threads}
        if self.timings is not None:
            out["timings"] = dict(self.timings)
        return out


def _text(item: Mapping[str, Any], name: str) -> str:
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
