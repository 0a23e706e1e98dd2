"""The states a job, a job's task and a measurement move through, stored as their values.

A state change is one guarded ``UPDATE`` (compare-and-set on the old state), so the sets below
(``JOB_ACTIVE``, ``MEASUREMENT_PENDING``) are what those guards and the progress reads use. The
columns are typed (``db.types.StoredEnum``): rows read back as members and a value outside the
enum is refused at the statement, not stored.
"""

from __future__ import annotations

import enum


class JobStatus(enum.StrEnum):
    """queued -> running -> done | failed; cancelled from either active state."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class TaskStatus(enum.StrEnum):
    """A job's task: queued -> running -> done; skipped when no template can tune it."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    SKIPPED = "skipped"


class MeasurementState(enum.StrEnum):
    """queued -> leased -> done (a lapsed lease goes back to queued); cancelled with its job.
    Imported records arrive done."""

    QUEUED = "queued"
    LEASED = "leased"
    DONE = "done"
    CANCELLED = "cancelled"


class ReportStatus(enum.StrEnum):
    """What a worker's report did to one measurement (``statuses`` of the report's answer)."""

    ACCEPTED = "accepted"
    #: finished before, by the same worker: the report changes nothing
    DUPLICATE = "duplicate"
    #: the result itself is unreadable or implausible (the reason says why)
    REJECTED = "rejected"
    #: the worker's lease lapsed before the result arrived: it is measured again
    EXPIRED = "expired"
    NOT_LEASED_BY_YOU = "not_leased_by_you"
    UNKNOWN = "unknown"


#: a job its driver still works on
JOB_ACTIVE = (JobStatus.QUEUED, JobStatus.RUNNING)
#: a job that changes no more
JOB_FINAL = (JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED)
#: a measurement that has no result yet and may still get one
MEASUREMENT_PENDING = (MeasurementState.QUEUED, MeasurementState.LEASED)
