"""Pure kernel-compiler core: workloads, config spaces, loop-nest IR, templates, code generators.

Nothing here touches HTTP, a database or xgboost; it can be imported anywhere, including on a
measurement worker that carries only numpy and llvmlite.
"""

from schedule_templates.errors import (
    CodegenError,
    InvalidConfigError,
    InvalidWorkloadError,
    ScheduleError,
)

__all__ = ["CodegenError", "InvalidConfigError", "InvalidWorkloadError", "ScheduleError"]
