"""One root exception for the package; expected failures are subclasses callers can classify."""


class ScheduleError(Exception):
    """Root of every error raised on purpose by ``schedule_templates``."""


class InvalidWorkloadError(ScheduleError, ValueError):
    """A workload key or parameter set that names no valid operator instance."""


class InvalidConfigError(ScheduleError, ValueError):
    """A config that does not belong to a space, or that a template cannot lower."""


class CodegenError(ScheduleError):
    """The code generator could not turn a loop nest into machine code."""


class DeviceCompileError(CodegenError):
    """The device compiler (nvcc for CUDA) rejected generated device code."""


class UnsupportedHostError(CodegenError):
    """The kernel needs CPU features (VNNI, AVX-512 BF16) that this host lacks."""


class MessageError(ScheduleError, ValueError):
    """A protocol message (or target string) that does not follow docs/worker-protocol.md."""
