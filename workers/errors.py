"""One root exception for the worker package; expected failures are subclasses callers classify.

It stands apart from ``tuner_service.errors.TunerServiceError``: a worker imports nothing of the
server (an import-linter contract), so the two packages share no exception class.
"""


class WorkerError(Exception):
    """Root of every error raised on purpose by ``workers``."""


class ProtocolError(WorkerError):
    """The server sent something that does not follow docs/worker-protocol.md."""


class ServerUnavailable(WorkerError):
    """The server could not be reached or answered 5xx; retry later (not sooner than
    ``retry_after_s`` when the server said so with ``Retry-After``)."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ServerRejected(WorkerError):
    """The server answered 4xx: retrying the same request will not help."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"server answered {status}: {message}")
        self.status = status


class BackendError(WorkerError):
    """A backend could not be created or used (unknown name, missing optional dependency)."""
