"""Request and response bodies. Field names here are part of the public contract."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    model_validator,
)

from schedule_templates.records import ErrorKind
from tuner_service.db.states import JobStatus, TaskStatus
from tuner_service.db.types import bounded_utc
from tuner_service.db.values import bounded_json, check_tree

MAX_ID = 2**31 - 1  # ids are 32-bit integers in the database
#: the validation context's mark that ``check_tree`` has passed the whole body (``Body``)
TREE_CHECKED = "tree_checked"
Id = Annotated[int, Field(ge=1, le=MAX_ID)]
#: seconds a worker may report for compiling or running one candidate (a day)
MAX_SECONDS = 86_400.0
#: a free-form object a worker describes itself with: bounded in size and depth, so one row
#: cannot break a view for everyone
FreeJson = Annotated[dict[str, Any], AfterValidator(bounded_json(64 * 1024, 8))]
#: a timestamp in a request: converted to UTC, from 1970 to 9000
Timestamp = Annotated[dt.datetime, AfterValidator(bounded_utc)]


class Body(BaseModel):
    """Every request body: unknown fields ignored; numbers finite and within 64 bits, text free
    of NUL and lone surrogates, nesting bounded (``check_tree``), wherever they sit."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _plain_json(cls, data: Any, info: ValidationInfo) -> Any:
        # Validated with a context dict (``api.wire.validate``), the outermost body checks the
        # whole tree once and the bodies nested in it skip their own walk: a report of 16
        # results was walked 33 times, most of its validation time. Nested bodies only ever
        # see parts of that tree, cleaned (``clean_result``) but never given new values.
        context = info.context if isinstance(info.context, dict) else None
        if context is None or not context.get(TREE_CHECKED):
            check_tree(data)
            if context is not None:
                context[TREE_CHECKED] = True
        return data


# ---- models and jobs -------------------------------------------------------------------------

class TaskPublic(BaseModel):
    task_id: int
    workload: str
    weight: int
    flops: int


class UnsupportedPublic(BaseModel):
    op: str
    node: str
    reason: str


class ModelPublic(BaseModel):
    model_id: int
    name: str = ""
    sha256: str = ""
    tasks: list[TaskPublic]
    unsupported: list[UnsupportedPublic]


class MeasureOptionsIn(Body):
    """Overrides of the run protocol for one job; unset fields keep the server defaults."""

    number: int | None = Field(default=None, ge=1, le=1_000_000)
    repeat: int | None = Field(default=None, ge=1, le=1000)
    min_repeat_ms: float | None = Field(default=None, ge=0, le=60_000)
    flush_cache: bool | None = None
    build_timeout_s: float | None = Field(default=None, gt=0, le=3600)
    run_timeout_s: float | None = Field(default=None, gt=0, le=3600)
    check_correctness: bool | None = None


class JobCreate(Body):
    model_id: Id | None = None
    workloads: list[Annotated[str, Field(max_length=512)]] | None = Field(
        default=None, max_length=10_000)
    target: str = Field(default="llvm", min_length=1, max_length=255)
    device_key: str | None = Field(default=None, max_length=255)
    trials_per_task: int = Field(default=64, ge=1, le=1_000_000)
    tuner: str = Field(default="xgb-transfer", max_length=64)
    threads: int | None = Field(default=None, ge=1, le=1024)
    options: MeasureOptionsIn = Field(default_factory=MeasureOptionsIn)


class JobCreated(BaseModel):
    job_id: int


class JobTaskPublic(BaseModel):
    task_id: int
    workload: str
    weight: int
    flops: int
    template: str | None
    description: str
    trials_done: int
    trials_budget: int
    best_gflops: float | None
    best_latency_s: float | None
    status: TaskStatus
    message: str = ""


class JobSummary(BaseModel):
    job_id: int
    status: JobStatus
    message: str = ""
    model_id: int | None
    target: str
    device_key: str | None
    tuner: str
    trials_per_task: int
    created_at: str | None
    started_at: str | None
    finished_at: str | None


class JobHealth(BaseModel):
    """Why an active job makes no progress: ``no_workers`` or ``failing``."""

    state: str
    message: str


class JobPublic(JobSummary):
    tasks: list[JobTaskPublic]
    #: set while an active job is stuck (no worker online, every recent result failed)
    health: JobHealth | None = None


class JobListItem(JobSummary):
    tasks: int
    trials_done: int
    trials_budget: int


class TaskConfigPublic(JobTaskPublic):
    template_version: int | None
    config: dict[str, Any] | None
    measure_id: int | None


class JobConfigs(BaseModel):
    job_id: int
    target: str
    status: JobStatus
    #: the thread count the job measured at (``tuner build`` makes it the library's default)
    threads: int | None = None
    tasks: list[TaskConfigPublic]


class HistoryPoint(BaseModel):
    trial: int
    measure_id: int
    config_index: int
    gflops: float
    latency_s: float | None
    error_kind: ErrorKind | None
    error_message: str
    worker_id: int | None
    #: (slowest - fastest) / fastest sample; ``noisy``: the machine was not quiet
    spread: float | None = None
    noisy: bool = False
    timestamp: str | None


class JobHistory(BaseModel):
    job_id: int
    task_id: int
    points: list[HistoryPoint]


# ---- shared log ------------------------------------------------------------------------------

class TuningLogPublic(BaseModel):
    workload: str
    op: str
    target: str
    template: str
    template_version: int
    config: dict[str, Any]
    #: None for a template default (``match`` "default"): nothing related was measured
    mean_cost: float | None
    gflops: float | None
    measurement_id: int | None
    job_id: int | None
    device_key: str | None
    #: the device class and threads it was measured with (``unknown``: before classes)
    device_class: str | None = None
    threads: int | None = None
    #: (slowest - fastest) / fastest sample; ``confirmed``: re-measured beside its rivals
    spread: float | None = None
    confirmed: bool = False
    updated_at: str | None
    #: which level of a device lookup answered: exact, microarch, isa_level, default or any
    match: str | None = None


class PackPublic(BaseModel):
    """The best configs of one device class (``tuner log export``; TVM's TopHub)."""

    format: str
    version: int
    device_class: str
    threads: int | None
    target: str | None
    resolved: bool
    created_at: str
    tasks: list[TuningLogPublic]


class PackImported(BaseModel):
    imported: int
    device_classes: list[str]


class ImportAnswer(BaseModel):
    imported: int
    duplicates: int


class Health(BaseModel):
    status: str
    database: str
    schema_revision: str | None
    version: str
