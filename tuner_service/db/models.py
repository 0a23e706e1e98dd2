"""ORM tables. Alembic (``migrations/``) is the only thing that creates or changes them.

Timestamps are written by the database clock (``utcnow``) wherever they take part in leases,
and are time-zone-aware UTC on both databases (``UtcDateTime``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from schedule_templates.records import ErrorKind
from tuner_service.db.states import JobStatus, MeasurementState, TaskStatus
from tuner_service.db.types import StoredEnum, UtcDateTime

NOW = text("CURRENT_TIMESTAMP")
Timestamp = UtcDateTime()


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class Model(Base):
    __tablename__ = "models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(255), default="")
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    unsupported: Mapped[list[Any]] = mapped_column(JSON, default=list)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, server_default=NOW)


class Task(Base):
    """One tunable workload of a model (or of a job given as a workload list)."""

    __tablename__ = "tasks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int | None] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    workload_key: Mapped[str] = mapped_column(String(512))
    op: Mapped[str] = mapped_column(String(64))
    weight: Mapped[int] = mapped_column(Integer, default=1)
    flops: Mapped[int] = mapped_column(BigInteger)
    nodes: Mapped[list[Any]] = mapped_column(JSON, default=list)


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int | None] = mapped_column(ForeignKey("models.id"))
    target: Mapped[str] = mapped_column(String(255))
    device_key: Mapped[str | None] = mapped_column(String(255))
    trials_per_task: Mapped[int] = mapped_column(Integer)
    tuner: Mapped[str] = mapped_column(String(64))
    options: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    threads: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[JobStatus] = mapped_column(StoredEnum(JobStatus, String(16)),
                                              default=JobStatus.QUEUED, index=True)
    message: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, server_default=NOW)
    started_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    finished_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    #: the server process that drives this job's tuners, and until when (database clock)
    driver_owner: Mapped[str | None] = mapped_column(String(64))
    driver_expires_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    #: the token that created the job: it (or an admin) may cancel it (None: created before 0002)
    owner_token_id: Mapped[int | None] = mapped_column(Integer)


class JobTask(Base):
    __tablename__ = "job_tasks"
    __table_args__ = (UniqueConstraint("job_id", "task_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"))
    template: Mapped[str | None] = mapped_column(String(128))
    template_version: Mapped[int | None] = mapped_column(Integer)
    trials_budget: Mapped[int] = mapped_column(Integer)
    trials_done: Mapped[int] = mapped_column(Integer, default=0)
    best_measurement_id: Mapped[int | None] = mapped_column(Integer)
    best_cost: Mapped[float | None] = mapped_column(Float)
    status: Mapped[TaskStatus] = mapped_column(StoredEnum(TaskStatus, String(16)),
                                               default=TaskStatus.QUEUED)
    message: Mapped[str] = mapped_column(Text, default="")


class Measurement(Base):
    """One candidate: queued -> leased -> done. Imported records arrive already done."""

    __tablename__ = "measurements"
    __table_args__ = (
        Index("ix_measurements_claim", "state", "target", "device_key", "id"),
        Index("ix_measurements_workload", "workload_key", "target"),
        Index("ix_measurements_lease", "state", "lease_expires_at"),
        Index("ix_measurements_finished", "finished_at", "worker_id"),
        Index("ix_measurements_task_state", "job_task_id", "state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uid: Mapped[str] = mapped_column(String(64), unique=True)
    job_task_id: Mapped[int | None] = mapped_column(
        ForeignKey("job_tasks.id", ondelete="CASCADE"), index=True
    )
    config_index: Mapped[int] = mapped_column(BigInteger)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    template: Mapped[str] = mapped_column(String(128))
    template_version: Mapped[int] = mapped_column(Integer)
    workload_key: Mapped[str] = mapped_column(String(512))
    target: Mapped[str] = mapped_column(String(255))
    device_key: Mapped[str | None] = mapped_column(String(255))
    state: Mapped[MeasurementState] = mapped_column(StoredEnum(MeasurementState, String(16)),
                                                    default=MeasurementState.QUEUED)
    lease_owner: Mapped[int | None] = mapped_column(Integer)
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    costs: Mapped[list[Any] | None] = mapped_column(JSON)
    mean_cost: Mapped[float | None] = mapped_column(Float)
    error_kind: Mapped[ErrorKind | None] = mapped_column(StoredEnum(ErrorKind, Integer()))
    error_message: Mapped[str] = mapped_column(Text, default="")
    compile_time_s: Mapped[float | None] = mapped_column(Float)
    wall_time_s: Mapped[float | None] = mapped_column(Float)
    peak_gflops: Mapped[float | None] = mapped_column(Float)
    #: the normalised class of the device that measured it (``workers.device_class``), and
    #: the threads it used; None where unknown (queued, or recorded before device classes)
    device_class: Mapped[str | None] = mapped_column(String(255))
    threads: Mapped[int | None] = mapped_column(Integer)
    #: the machine was not quiet while it was timed; ``load``: other processes' cores
    noisy: Mapped[bool | None] = mapped_column(Boolean)
    load: Mapped[float | None] = mapped_column(Float)
    #: "tune" (a trial of the search) or "confirm" (a re-measurement of a top candidate)
    purpose: Mapped[str] = mapped_column(String(16), default="tune", server_default="tune")
    #: where the worker's time for this candidate went (``jobs.reports.TIMING_PARTS``
    #: seconds, each optional), as it reported it; None before 0004 or when it sent none
    timings: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    worker_id: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, server_default=NOW)
    claimed_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    finished_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)


class Worker(Base):
    __tablename__ = "workers"
    __table_args__ = (Index("ix_workers_online", "target", "device_key", "last_heartbeat"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), default="")
    device_key: Mapped[str] = mapped_column(String(255))
    target: Mapped[str] = mapped_column(String(255))
    hardware: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    software: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    token_id: Mapped[int | None] = mapped_column(Integer)
    registered_at: Mapped[dt.datetime] = mapped_column(Timestamp, server_default=NOW)
    last_heartbeat: Mapped[dt.datetime | None] = mapped_column(Timestamp)


class Token(Base):
    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), default="")
    role: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, server_default=NOW)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    #: a worker token bound to one device key registers workers for that key only
    device_key: Mapped[str | None] = mapped_column(String(255))


class TuningLogEntry(Base):
    """The best known config per (workload, target, device class, threads), across all jobs,
    users and imports. ``microarch`` and ``isa_level`` repeat fields of the class id, so that
    lookups can fall back to related devices in SQL."""

    __tablename__ = "tuning_log"
    __table_args__ = (
        UniqueConstraint("workload_key", "target", "device_class", "threads",
                         name="uq_tuning_log_device"),
        Index("ix_tuning_log_workload", "workload_key", "target"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_key: Mapped[str] = mapped_column(String(512))
    op: Mapped[str] = mapped_column(String(64), index=True)
    target: Mapped[str] = mapped_column(String(255))
    template: Mapped[str] = mapped_column(String(128))
    template_version: Mapped[int] = mapped_column(Integer)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    mean_cost: Mapped[float] = mapped_column(Float)
    gflops: Mapped[float] = mapped_column(Float)
    measurement_id: Mapped[int | None] = mapped_column(Integer)
    job_id: Mapped[int | None] = mapped_column(Integer)
    device_key: Mapped[str | None] = mapped_column(String(255))
    device_class: Mapped[str] = mapped_column(String(255), default="unknown",
                                              server_default="unknown")
    microarch: Mapped[str] = mapped_column(String(64), default="unknown",
                                           server_default="unknown")
    isa_level: Mapped[str] = mapped_column(String(64), default="unknown",
                                           server_default="unknown")
    threads: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    #: (slowest - fastest) / fastest of the samples behind ``mean_cost``
    spread: Mapped[float | None] = mapped_column(Float)
    #: ``mean_cost`` comes from re-measuring the job's top candidates side by side
    confirmed: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    updated_at: Mapped[dt.datetime] = mapped_column(Timestamp, server_default=NOW)
