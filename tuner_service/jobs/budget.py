"""What one job may ask of a worker: tensor sizes, work per candidate, and the run protocol.

A job is checked once, when it is created, against the deployment's ``ResourceBudget``
(settings ``TUNER_BUDGET_*``): a workload whose tensors would not fit in a worker's memory, or
measure options that would hold a worker for an hour per candidate, are refused with a 422 that
names the limit and the setting that raises it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from schedule_templates.workloads import Workload
from tuner_service.errors import InvalidInputError
from tuner_service.settings import Settings

#: bytes per element: every tuned workload is fp32 (int8 and bf16 arrive as their own keys)
ELEMENT_BYTES = 4


@dataclasses.dataclass(frozen=True)
class ResourceBudget:
    #: bytes of any one input or output tensor of a candidate
    max_tensor_bytes: int = 1 << 30
    #: floating-point operations of one run of a candidate
    max_candidate_flops: int = 500 * 10**9
    #: caps of the run protocol a job may ask for (``options``)
    max_number: int = 10_000
    max_repeat: int = 100
    max_min_repeat_ms: float = 10_000.0
    max_build_timeout_s: float = 300.0
    max_run_timeout_s: float = 120.0

    @classmethod
    def from_settings(cls, settings: Settings) -> ResourceBudget:
        """The deployment's budget (settings ``TUNER_BUDGET_*``)."""
        return cls(
            max_tensor_bytes=settings.budget_max_tensor_bytes,
            max_candidate_flops=settings.budget_max_candidate_flops,
            max_number=settings.budget_max_number, max_repeat=settings.budget_max_repeat,
            max_min_repeat_ms=settings.budget_max_min_repeat_ms,
            max_build_timeout_s=settings.budget_max_build_timeout_s,
            max_run_timeout_s=settings.budget_max_run_timeout_s,
        )

    def check_workloads(self, workloads: Iterable[tuple[str, Workload]]) -> None:
        """Raise InvalidInputError for the first workload over a limit (``where`` names it)."""
        for where, workload in workloads:
            tensors = {**workload.input_shapes(), "output": workload.output_shape()}
            for name, shape in tensors.items():
                size = int(np.prod(shape, dtype=np.int64)) * ELEMENT_BYTES
                if size > self.max_tensor_bytes:
                    raise InvalidInputError(
                        f"{where}: tensor {name!r} of shape {list(shape)} needs {size} bytes, "
                        f"over the limit of {self.max_tensor_bytes} bytes per tensor "
                        "(setting TUNER_BUDGET_MAX_TENSOR_BYTES)")
            flops = workload.flops()
            if flops > self.max_candidate_flops:
                raise InvalidInputError(
                    f"{where}: {flops:.3g} FLOPs per run, over the limit of "
                    f"{self.max_candidate_flops:.3g} FLOPs per candidate "
                    "(setting TUNER_BUDGET_MAX_CANDIDATE_FLOPS)")

    def check_options(self, options: Mapping[str, Any]) -> None:
        """Raise InvalidInputError when a measure option passes its cap."""
        caps = {"number": self.max_number, "repeat": self.max_repeat,
                "min_repeat_ms": self.max_min_repeat_ms,
                "build_timeout_s": self.max_build_timeout_s,
                "run_timeout_s": self.max_run_timeout_s}
        for name, cap in caps.items():
            value = options.get(name)
            if value is not None and value > cap:
                raise InvalidInputError(
                    f"options.{name}={value} is over the limit of {cap} "
                    f"(setting TUNER_BUDGET_MAX_{name.upper()})")
