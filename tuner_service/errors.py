"""The root of every error ``tuner_service`` raises on purpose, and the expected failures that
several of its layers raise.

Each layer keeps its own branch under ``TunerServiceError``: ``db.errors`` (the database failed,
is busy or is not at the migration head), ``compiler.frontend.errors`` (``FrontendError``),
``compiler.deploy.errors`` (``DeployError``) and ``cost_model.base`` (``CostModelError``).
An error says what went wrong in words for the user; which HTTP status (and ``Retry-After``) it
becomes is decided in one place, the API's handler (``api/errors.py``). Workers cannot import
this package: their root is ``workers.errors.WorkerError``, and the kernel compiler's is
``schedule_templates.errors.ScheduleError``.
"""

from __future__ import annotations


class TunerServiceError(Exception):
    """Root of every error ``tuner_service`` raises on purpose."""


class NotFoundError(TunerServiceError):
    """A job, model, worker or tuned config that does not exist."""


class InvalidInputError(TunerServiceError):
    """A request that names an invalid workload, config, tuner or model."""


class ConflictError(TunerServiceError):
    """A write that conflicts with what is stored (a unique key already taken)."""


class PayloadTooLargeError(TunerServiceError):
    """A body or an upload over the deployment's size limit."""


class AuthError(TunerServiceError):
    """No bearer token, or one that is unknown or revoked."""


class ForbiddenError(TunerServiceError):
    """A valid token whose role (or device key) does not allow the request."""


class UnavailableError(TunerServiceError):
    """An optional part (the ONNX frontend) is not installed."""
