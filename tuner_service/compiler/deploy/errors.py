"""Errors raised on purpose while building or running a deployable kernel library.

Their root ``DeployError`` is the model compiler's branch of ``tuner_service.errors``.
"""

from __future__ import annotations

from tuner_service.errors import TunerServiceError


class DeployError(TunerServiceError):
    """Root of every error raised on purpose by ``tuner_service.compiler.deploy``."""


class UnsupportedOperatorError(DeployError):
    """The model uses an operator (or an attribute of one) that the runner cannot execute."""

    def __init__(self, op_type: str, node: str, reason: str = "") -> None:
        detail = f": {reason}" if reason else ""
        super().__init__(f"cannot run operator {op_type} (node {node!r}){detail}")
        self.op_type = op_type
        self.node = node


class LibraryError(DeployError):
    """A kernel library that is missing, corrupt, built for another model, template or CPU."""


class BuildError(DeployError):
    """Compiling or linking the kernel library failed."""


class ConfigSourceError(DeployError):
    """A configs file or server answer that cannot be read as tuned configs."""


class FeedError(DeployError):
    """Input arrays that do not fit the model, or an inputs file that cannot be read."""
