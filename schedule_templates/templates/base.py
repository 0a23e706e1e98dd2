"""The template contract and its registry.

A template is pure functions of (workload, config): ``space`` builds the knobs, ``lower`` turns a
config into a loop-nest kernel, ``pack`` lays constant weights out the way that kernel reads them
(once, outside the timed region). Adding a template is one module that calls ``register``.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

import numpy as np

from schedule_templates.errors import InvalidConfigError, InvalidWorkloadError
from schedule_templates.ir.nodes import Kernel
from schedule_templates.space import Config, ConfigSpace
from schedule_templates.target import Target
from schedule_templates.workloads import Workload


class Template(ABC):
    #: globally unique, e.g. ``dense.x86``; records and the worker protocol carry it
    name: ClassVar[str]
    op: ClassVar[str]
    #: the target kind this template generates code for: ``llvm`` or ``cuda``
    target_kind: ClassVar[str]
    #: bump when a change makes old measurements of this template incomparable
    version: ClassVar[int] = 1
    #: whether ``lower`` applies a workload's fused epilogue; templates that do not refuse
    #: fused workloads in ``check`` (their output would silently lack the epilogue)
    fuses_epilogue: ClassVar[bool] = False

    @abstractmethod
    def space(self, workload: Workload, device: Mapping[str, Any] | None = None) -> ConfigSpace:
        """The knobs for this workload; ``device`` holds limits a worker reported (GPU)."""

    @abstractmethod
    def default_config(self, workload: Workload) -> Config:
        """A sensible config for when nothing has been tuned."""

    @abstractmethod
    def lower(self, workload: Workload, config: Config) -> Kernel:
        """The loop nest of one kernel. Raises InvalidConfigError for configs it cannot run."""

    def pack(self, workload: Workload, config: Config, inputs: Mapping[str, np.ndarray]
             ) -> dict[str, np.ndarray]:
        """Map workload inputs to kernel arguments (by buffer name); the default passes them
        through. Only constant inputs may be transformed here: this runs outside the timing."""
        return dict(inputs)

    def cached_space(self, workload: Workload) -> ConfigSpace:
        """``space(workload)`` without device limits, built once per (template, workload):
        checks and decodes on the data path read it for every candidate."""
        return _host_space(self, workload)

    def check(self, workload: Workload, config: Config) -> None:
        """Raise InvalidConfigError unless ``config`` belongs to this workload's space."""
        if workload.op != self.op:
            raise InvalidWorkloadError(f"template {self.name} does not handle {workload.op}")
        if workload.epilogue_spec and not self.fuses_epilogue:
            raise InvalidWorkloadError(
                f"template {self.name} cannot fuse the epilogue {workload.epilogue_spec}; "
                f"use the base workload {workload.base_key}"
            )
        space = self.cached_space(workload)
        fresh = space.get(config.index)
        if fresh.entities != config.entities:
            raise InvalidConfigError(f"config {config.index} does not belong to this space")
        if not space.is_valid(config.index):
            raise InvalidConfigError(f"config {config.index} is filtered out by {self.name}")


@functools.lru_cache(maxsize=1024)
def _host_space(template: Template, workload: Workload) -> ConfigSpace:
    return template.space(workload)


W = TypeVar("W", bound=Workload)


def as_workload(workload: Workload, cls: type[W]) -> W:
    """Narrow a workload to the class a template handles, or refuse it clearly."""
    if not isinstance(workload, cls):
        raise InvalidWorkloadError(f"expected a {cls.op} workload, got {workload.op}")
    return workload


_TEMPLATES: dict[str, Template] = {}


def register(template: type[Template]) -> type[Template]:
    _TEMPLATES[template.name] = template()
    return template


def all_templates() -> list[Template]:
    _load_builtin()
    return sorted(_TEMPLATES.values(), key=lambda t: t.name)


def template_by_name(name: str) -> Template:
    _load_builtin()
    try:
        return _TEMPLATES[name]
    except KeyError:
        raise InvalidConfigError(
            f"unknown template {name!r}; known: {', '.join(sorted(_TEMPLATES))}"
        ) from None


def get_template(op: str, target: str = "llvm") -> Template:
    """The template for an operator on a target (one per pair today)."""
    _load_builtin()
    kind = Target.parse(target).kind
    for template in _TEMPLATES.values():
        if template.op == op and template.target_kind == kind:
            return template
    raise InvalidWorkloadError(f"no template for {op} on target {target!r}")


def _load_builtin() -> None:
    """Import every module of the templates package once: each registers its templates.

    Discovery instead of an import list, so that adding a template is adding one module.
    Imported lazily so that this module stays cheap to import and free of cycles."""
    global _DISCOVERED
    if _DISCOVERED:
        return
    import importlib
    import pkgutil

    from schedule_templates import templates as package

    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")
    _DISCOVERED = True


_DISCOVERED = False
