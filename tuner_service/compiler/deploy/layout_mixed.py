"""Per-layer layouts for ``tuner build --layout auto``: blocked plans that keep some conv
layers plain, chosen from the two whole plans' step profiles.

The whole-model choice (``layout_choice``) loses where a model's best plan mixes layouts:
DenseNet-121's 3x3 convs are faster plain (the NCHW template's Winograd) while the rest gains
from blocked activations; SqueezeNet's fire modules run faster plain (their channel concats and
pools would need transforms) while its 1x1 classifier over 512 channels runs 1.8x faster
blocked. Both plans are built anyway, so each conv layer's time is known in each layout (every
step timed alone, ``ModelRunner.profile``), and so is what a layout transform costs per element
(the blocked plan's own transforms). Two candidates follow, each a blocked plan with a set of
conv layers kept plain (``frontend.layout.plan_layout``'s ``plain``):

- from the blocked plan: a layer goes plain where its plain time plus two transforms of its
  output's size (into and out of the plain layout) is below its blocked time;
- from the plain plan: a layer is blocked only where its blocked time plus two transforms is
  below its plain time (every other conv layer plain).

A candidate that equals a whole plan, or repeats the other, is dropped. ``layout_choice``
builds the rest and times every library as it would run; the transform estimate only proposes.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from tuner_service.compiler.deploy.executor import ModelRunner
from tuner_service.compiler.deploy.generated_step import GeneratedStep
from tuner_service.compiler.deploy.kernel_step import KernelStep

#: seconds per element of a layout transform when the blocked plan has none to time, or
#: too few elements in them (``MIN_RATE_ELEMENTS``) for the per-step cost of a profile not to
#: swamp the rate: ResNet-50's blocked plan has one, of its 2048-element output, profiled at
#: 7.4 us (3.6 ns an element) where a 14x14x256 layer's transforms run at 0.6 ns an element
#: in the model; with that rate two builds kept 6 and 7 of its conv layers plain
FALLBACK_TRANSFORM_S = 1e-9
MIN_RATE_ELEMENTS = 1 << 16
#: profile runs per step in each round, and rounds (the two plans' profiles interleaved)
PROFILE_RUNS = 5
PROFILE_ROUNDS = 3


@dataclasses.dataclass(frozen=True)
class LayerTimes:
    """One conv layer (by its plain output tensor): seconds alone in each plan, output size."""

    plain_s: float
    blocked_s: float
    elements: int


def mixed_plans(plain: ModelRunner, blocked: ModelRunner) -> dict[str, frozenset[str]]:
    """Candidate plans (name -> the conv layers a blocked plan keeps plain), at most two."""
    feeds = plain.random_feeds(0)
    times, rate = layer_times(plain, blocked, feeds)
    return candidates(times, rate)


def candidates(times: dict[str, LayerTimes], transform_s: float) -> dict[str, frozenset[str]]:
    """The two candidates of the module docstring from measured layer times and the seconds
    per element of one transform; those equal to a whole plan or to each other dropped."""
    every = frozenset(times)

    def transforms(t: LayerTimes) -> float:
        return 2 * transform_s * t.elements

    from_blocked = frozenset(name for name, t in times.items()
                             if t.plain_s + transforms(t) < t.blocked_s)
    from_plain = every - {name for name, t in times.items()
                          if t.blocked_s + transforms(t) < t.plain_s}
    found: dict[str, frozenset[str]] = {}
    for name, keep in (("mostly-blocked", from_blocked), ("mostly-plain", from_plain)):
        if keep and keep != every and keep not in found.values():
            found[name] = keep
    return found


def layer_times(plain: ModelRunner, blocked: ModelRunner, feeds: dict[str, np.ndarray]
                ) -> tuple[dict[str, LayerTimes], float]:
    """Every conv layer the blocked plan blocks, timed alone in both plans, and the seconds
    per element of the blocked plan's transforms."""
    plain_steps, blocked_steps = _profiles([plain, blocked], feeds)
    plain_s = _kernel_seconds(plain_steps)
    times: dict[str, LayerTimes] = {}
    for output, (seconds, _, op) in _kernel_seconds(blocked_steps).items():
        if op.endswith("_nchwc") and output in plain_s:
            times[output] = LayerTimes(plain_s[output][0], seconds, plain_s[output][1])
    return times, transform_rate(blocked_steps)


def transform_rate(profile: list[tuple[object, float]]) -> float:
    """Seconds per element of a profile's layout transforms, all of them together: the median
    of each one's rate let a tiny transform's fixed cost count like a large one's (ResNet-50
    with its pools blocked has two: the 3-channel input's, 0.25 ns an element, and the
    2048-element output's, several times that; so no conv layer was kept plain)."""
    timed = [(seconds, math.prod(step.op.output_shape())) for step, seconds in profile
             if isinstance(step, GeneratedStep) and step.op.kind in ("to_nchwc", "from_nchwc")]
    elements = sum(count for _, count in timed)
    if elements < MIN_RATE_ELEMENTS:
        return FALLBACK_TRANSFORM_S
    return sum(seconds for seconds, _ in timed) / elements


def _profiles(runners: list[ModelRunner], feeds: dict[str, np.ndarray]
              ) -> list[list[tuple[object, float]]]:
    """Each runner's steps profiled in ``PROFILE_ROUNDS`` rounds, the runners in turn; a
    step's seconds are its fastest round's median. One profile of each plan, one after the
    other, let a busy moment of a shared machine decide layers: two ResNet-50 builds kept 7
    and 6 layers plain, and the second ran two 14x14 convs blocked at 1.46 ms that ran 1.0
    plain (Intel Xeon, 1 thread)."""
    best = [[math.inf] * len(runner.steps) for runner in runners]
    for _ in range(PROFILE_ROUNDS):
        for runner, column in zip(runners, best, strict=True):
            for i, row in enumerate(runner.profile(feeds, PROFILE_RUNS)):
                column[i] = min(column[i], float(row["median_s"]))
    return [list(zip(runner.steps, column, strict=True))
            for runner, column in zip(runners, best, strict=True)]


def _kernel_seconds(profile: list[tuple[object, float]]) -> dict[str, tuple[float, int, str]]:
    """Plain output tensor -> (seconds alone, output elements, operator) of each tuned-template
    kernel step of a profile (a blocked tensor ``T@nchw16c`` counts as ``T``)."""
    found = {}
    for step, seconds in profile:
        if isinstance(step, KernelStep) and not isinstance(step, GeneratedStep) \
                and hasattr(step.kernel, "workload"):
            output = step.outputs[0].split("@", 1)[0]
            found[output] = (seconds, int(step.output.size), step.kernel.workload.op)
    return found
