"""Request and response bodies of the worker protocol (docs/worker-protocol.md): register,
heartbeat, claim, report, release. Field names here are part of the public contract; the
claim and report bodies are validated by ``api/wire.py``, the rest by FastAPI."""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from schedule_templates.protocol import Report
from schedule_templates.records import ErrorKind, MeasureResult
from tuner_service.api.schemas import MAX_SECONDS, Body, FreeJson, Id
from tuner_service.db.states import ReportStatus

# ---- worker protocol -------------------------------------------------------------------------

class WorkerRegister(Body):
    device_key: str = Field(min_length=1, max_length=255)
    target: str = Field(min_length=1, max_length=255, pattern=r"\S")  # a kind: Target.parse
    name: str = Field(default="", max_length=255)
    hardware: FreeJson = Field(default_factory=dict)
    software: FreeJson = Field(default_factory=dict)


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
    items: list[dict[str, Any]]  # ``ClaimItem.to_json`` of each, encoded by the claim route


Seconds = Annotated[float, Field(ge=0.0, le=MAX_SECONDS)]


class TimingsIn(Body):
    """Where a worker's time for one candidate went (``jobs.results.TIMING_PARTS``), each part
    optional: seconds waiting for work, claiming, building, checking, measuring, reporting."""

    wait_s: Seconds | None = None
    claim_s: Seconds | None = None
    build_s: Seconds | None = None
    check_s: Seconds | None = None
    measure_s: Seconds | None = None
    report_s: Seconds | None = None

    def to_json(self) -> dict[str, float] | None:
        parts = self.model_dump(exclude_none=True)
        return parts or None


class ResultIn(Body):
    measure_id: Id
    costs: list[float] = Field(default_factory=list, max_length=10_000)
    error_kind: int = Field(default=ErrorKind.NONE, ge=min(ErrorKind), le=max(ErrorKind))
    error_message: str = Field(default="", max_length=20_000)
    compile_time_s: float = Field(default=0.0, ge=0, le=MAX_SECONDS)
    wall_time_s: float = Field(default=0.0, ge=0, le=MAX_SECONDS)
    peak_gflops: float | None = None
    #: what the worker measured with (``workers.device_class``) and the machine's quietness;
    #: context like the peak: an unreadable value is dropped, never the result
    device_class: str | None = None
    threads: int | None = None
    noisy: bool = False
    load: float | None = None
    #: the worker's time split for this candidate; context too: an unreadable one is dropped
    timings: TimingsIn | None = None
    #: set by the server while decoding (whatever a client sends is overwritten): why this one
    #: result is refused while the rest of its batch is stored
    invalid: str = Field(default="", exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _lenient(cls, data: Any) -> Any:
        return clean_result(data)

    @field_validator("device_class", "threads", "load", mode="before")
    @classmethod
    def _context(cls, value: Any, info: ValidationInfo) -> Any:
        return device_context(info.field_name or "", value)

    @field_validator("timings", mode="wrap")
    @classmethod
    def _readable_timings(cls, value: Any, handler: ValidatorFunctionWrapHandler
                          ) -> TimingsIn | None:
        try:
            timings: TimingsIn | None = handler(value)
        except ValidationError:
            return None
        return timings

    @field_validator("peak_gflops")
    @classmethod
    def _plausible_peak(cls, value: float | None) -> float | None:
        # A peak is context for the dashboard, not a measurement: one that is not a positive
        # finite number is dropped rather than costing the worker its result.
        return value if value is not None and math.isfinite(value) and value > 0 else None

    def to_report(self) -> Report:
        """The protocol's report of this decoded result."""
        return Report(self.measure_id, MeasureResult.from_json(self.model_dump()),
                      self.peak_gflops, self.device_class, self.threads,
                      self.timings.to_json() if self.timings else None)


def device_context(name: str, value: Any) -> Any:
    """A result's device class, threads or load as stored, None when it cannot be read."""
    from workers.device_class import DeviceClass, DeviceClassError

    if name == "device_class":
        try:
            return DeviceClass.parse(value).id if isinstance(value, str) and value else None
        except DeviceClassError:
            return None
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if name == "threads":
        return int(value) if ok and value == int(value) and 1 <= value <= 4096 else None
    return float(value) if ok and 0 <= value <= 1e6 else None


class _Cleaned(dict[str, Any]):
    """A result ``clean_result`` has cleaned: a second pass leaves it as it is (a decoded body
    holds plain dicts only, so a client cannot send one)."""


def clean_result(data: Any) -> Any:
    """A worker's error text and peak are context: a NUL or a NaN there is cleaned, not refused
    (refusing would cost the measurement). Runs before the shared checks of ``Body``: on the
    results of a ``ResultsIn`` (whose walk would refuse a NaN) and again on each ``ResultIn``,
    where a result cleaned once is passed through; cleaning it twice lost why its costs were
    refused (``invalid`` was reset once its NaN costs had been emptied)."""
    if not isinstance(data, dict) or isinstance(data, _Cleaned):
        return data
    data = _Cleaned(data)
    message = data.get("error_message")
    if isinstance(message, str):
        data["error_message"] = message.replace("\x00", "").encode(
            "utf-8", "replace").decode("utf-8")[-20_000:]
    for key in ("peak_gflops", "load"):  # context, dropped when it is not a finite number
        value = data.get(key)
        if isinstance(value, float) and not math.isfinite(value):
            data[key] = None
    timings = data.get("timings")
    if isinstance(timings, dict) and any(isinstance(v, float) and not math.isfinite(v)
                                         for v in timings.values()):
        data["timings"] = None  # context: dropped, as an unreadable peak
    costs = data.get("costs")
    data["invalid"] = ""
    if isinstance(costs, list) and any(isinstance(c, float) and not math.isfinite(c)
                                       for c in costs):
        # refused as this result's status (the batch's other results still count)
        data["costs"], data["invalid"] = [], "costs must be positive finite seconds"
    return data


class ResultsIn(Body):
    results: list[ResultIn] = Field(max_length=10_000)

    @model_validator(mode="before")
    @classmethod
    def _lenient(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("results"), list):
            return {**data, "results": [clean_result(r) for r in data["results"]]}
        return data


class Rejected(BaseModel):
    measure_id: int
    reason: str


class ResultStatus(BaseModel):
    measure_id: int
    status: ReportStatus
    reason: str = ""


class ResultsAnswer(BaseModel):
    accepted: list[int]
    duplicates: list[int]
    #: every result not accepted or duplicate, with its reason (a worker drops them all)
    rejected: list[Rejected]
    #: one entry per reported result, in the order stored
    statuses: list[ResultStatus] = Field(default_factory=list)


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
