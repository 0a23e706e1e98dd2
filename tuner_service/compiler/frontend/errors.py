"""Errors raised on purpose by the ONNX frontend.

One root (``FrontendError``, a branch of ``tuner_service.errors``) so callers can catch the
package's failures in one place; a layer we cannot map is not an error at all but an
``Unsupported`` record in the extraction result.
"""

from __future__ import annotations

from tuner_service.errors import TunerServiceError


class FrontendError(TunerServiceError):
    """Root of every error raised on purpose by ``tuner_service.compiler.frontend``."""


class ModelError(FrontendError, ValueError):
    """The input is not a usable ONNX model; the message says why, in words for the uploader."""


class ModelTooLarge(ModelError):
    """An uploaded archive unpacks to more bytes or members than the server's limits."""


class UnmappableNode(FrontendError):
    """One node cannot become a workload; ``extract_tasks`` turns this into an ``Unsupported``.

    It never leaves ``extract_tasks``: a layer we cannot tune is data about the model, not a
    failure of the request.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
