"""Where a candidate's time went, reported with its result (``timings`` in the protocol).

Stages, in the order a candidate meets them:

* ``wait_s``: queued in the worker, from the claim's answer until a process starts building it,
  plus any wait for the timing core after its check;
* ``claim_s``: the round trip of the claim request that brought it (prefetched in the
  background: it delays the candidate only when the worker ran dry);
* ``build_s``: checked against the template, lowered, compiled (or loaded from the compile
  cache) and bound to its inputs;
* ``check_s``: one run compared with the numpy reference;
* ``measure_s``: the timed protocol with its hygiene probes (and re-measurements);
* ``report_s``: from the end of its measurement until the report carrying it was sent
  (spooling and batching; the report's own round trip cannot be inside the report).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

STAGES = ("wait_s", "claim_s", "build_s", "check_s", "measure_s", "report_s")


@dataclasses.dataclass(frozen=True)
class StageTimes:
    """Seconds per stage of one candidate."""

    wait_s: float = 0.0
    claim_s: float = 0.0
    build_s: float = 0.0
    check_s: float = 0.0
    measure_s: float = 0.0
    report_s: float = 0.0

    def to_json(self) -> dict[str, float]:
        return {name: round(max(0.0, getattr(self, name)), 6) for name in STAGES}

    @classmethod
    def from_json(cls, data: Mapping[str, float]) -> StageTimes:
        return cls(**{name: float(data[name]) for name in STAGES if name in data})

    @classmethod
    def from_marks(cls, marks: Mapping[str, float]) -> StageTimes:
        """Stages from the moments a measuring process entered its phases: ``compile``,
        ``verify`` (when checked), ``time`` (asked for the timing core), ``go`` (got it) and
        ``end``; a candidate that failed early lacks the later ones."""
        end = marks["end"]
        verify, timed, go = marks.get("verify"), marks.get("time"), marks.get("go")
        build_end = verify if verify is not None else (timed if timed is not None else end)
        check = ((timed if timed is not None else end) - verify) if verify is not None else 0.0
        return cls(build_s=build_end - marks["compile"], check_s=check,
                   wait_s=go - timed if go is not None and timed is not None else 0.0,
                   measure_s=end - go if go is not None else 0.0)
