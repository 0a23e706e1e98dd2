"""Request and response bodies. Field names here are part of the public contract."""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from schedule_templates.records import MeasureResult

MAX_ID = 2**31 - 1  # ids are 32-bit integers in the database
Id = Annotated[int, Field(ge=1, le=MAX_ID)]


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


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
    workloads: list[str] | None = Field(default=None, max_length=10_000)
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
    status: str
    message: str = ""


class JobSummary(BaseModel):
    job_id: int
    status: str
    message: str = ""
    model_id: int | None
    target: str
    device_key: str | None
    tuner: str
    trials_per_task: int
    created_at: str | None
    started_at: str | None
    finished_at: str | None


class JobPublic(JobSummary):
    tasks: list[JobTaskPublic]


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
    status: str
    #: the thread count the job measured at (``tuner build`` makes it the library's default)
    threads: int | None = None
    tasks: list[TaskConfigPublic]


class HistoryPoint(BaseModel):
    trial: int
    measure_id: int
class JobHealth(BaseModel):
    """Why an active job makes no progress: ``no_workers`` or ``failing``."""

    state: str
    message: str


    config_index: int
    gflops: float
    #: set while an active job is stuck (no worker online, every recent result failed)
    health: JobHealth | None = None
    latency_s: float | None
    error_kind: int | None
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


# ---- worker protocol -------------------------------------------------------------------------

class WorkerRegister(Body):
    device_key: str = Field(min_length=1, max_length=255)
    target: str = Field(min_length=1, max_length=255)
    name: str = Field(default="", max_length=255)
    hardware: dict[str, Any] = Field(default_factory=dict)
    software: dict[str, Any] = Field(default_factory=dict)


class WorkerRegistered(BaseModel):
    worker_id: int
    lease_s: float
    heartbeat_s: float


class MeasureIds(Body):
    measure_ids: list[Id] = Field(default_factory=list, max_length=10_000)


class HeartbeatAnswer(BaseModel):
    extended: list[int]
    lost: list[int]


class ClaimRequest(Body):
    max_items: int = Field(default=1, ge=1, le=10_000)
    wait_s: float = Field(default=0.0, ge=0.0, le=3600.0)


class ClaimAnswer(BaseModel):
    items: list[dict[str, Any]]


class ResultIn(Body):
    measure_id: Id
    costs: list[float] = Field(default_factory=list, max_length=100_000)
    error_kind: int = Field(default=0, ge=0, le=8)
    error_message: str = ""
    compile_time_s: float = 0.0
    wall_time_s: float = 0.0
    peak_gflops: float | None = None

    @field_validator("error_message")
    @classmethod
    def _no_nul(cls, value: str) -> str:
        return value.replace("\x00", "")  # PostgreSQL text cannot hold NUL

    @field_validator("peak_gflops")
    @classmethod
    def _plausible_peak(cls, value: float | None) -> float | None:
        # A peak is context for the dashboard, not a measurement: one that is not a positive
        # finite number is dropped rather than costing the worker its result.
        return value if value is not None and math.isfinite(value) and value > 0 else None

    def to_result(self) -> MeasureResult:
        return MeasureResult.from_json(self.model_dump())


class ResultsIn(Body):
    results: list[ResultIn] = Field(max_length=10_000)


class Rejected(BaseModel):
    measure_id: int
    reason: str


class ResultsAnswer(BaseModel):
    accepted: list[int]
    duplicates: list[int]
    rejected: list[Rejected]


class ReleaseAnswer(BaseModel):
    released: list[int]


class WorkerPublic(BaseModel):
    worker_id: int
    name: str
    device_key: str
    target: str
    hardware: dict[str, Any]
    software: dict[str, Any]
    registered_at: str | None
    last_heartbeat: str | None
    online: bool


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
