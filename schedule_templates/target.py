"""A target string parsed into its kind and options: the one place a target string is split.

Part of the worker protocol (``protocol`` re-exports it); a module of its own so that the
templates, which look themselves up by target, need not import the protocol.
"""

from __future__ import annotations

import dataclasses
import itertools

from schedule_templates.errors import MessageError

#: a worker target with more options than this serves only its own string and its bare kind
_MAX_OPTION_SUBSETS = 6


@dataclasses.dataclass(frozen=True)
class Target:
    """A parsed target: ``llvm``, ``llvm -mcpu=znver4``, ``cuda -arch=sm_90``.

    A job's target names what it needs; a worker's names what it is. A ``cuda`` worker resolves
    its architecture from its device when it starts (``with_option("-arch", ...)``), a job
    usually does not name one: ``serves`` is the one rule that matches the two."""

    kind: str
    options: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Target:
        words = text.split() if isinstance(text, str) else []
        if not words:
            raise MessageError(f"a target needs a kind such as llvm or cuda, got {text!r}")
        return cls(words[0], tuple(words[1:]))

    def __str__(self) -> str:
        return " ".join((self.kind, *self.options))

    def option(self, name: str) -> str | None:
        """The value of ``name=value`` (``option("-arch")`` -> ``sm_90``), None when absent."""
        for word in self.options:
            key, eq, value = word.partition("=")
            if eq and key == name:
                return value
        return None

    def with_option(self, name: str, value: str) -> Target:
        """This target with ``name=value`` set (replacing a value it had)."""
        kept = tuple(w for w in self.options if w.partition("=")[0] != name)
        return Target(self.kind, (*kept, f"{name}={value}"))

    def serves(self, job: Target) -> bool:
        """Whether a worker of this target may measure a job for ``job``: the same kind, and
        every option the job names the worker has too (``cuda -arch=sm_90`` serves ``cuda``
        and ``cuda -arch=sm_90``, not ``cuda -arch=sm_80``)."""
        return self.kind == job.kind and set(job.options) <= set(self.options)

    def served(self) -> list[str]:
        """The job target strings this worker target ``serves`` (every subset of its options,
        in its order), for a claim that matches stored job targets with ``IN``."""
        if len(self.options) > _MAX_OPTION_SUBSETS:
            return sorted({str(self), self.kind})
        return [" ".join((self.kind, *subset)) for n in range(len(self.options) + 1)
                for subset in itertools.combinations(self.options, n)]
