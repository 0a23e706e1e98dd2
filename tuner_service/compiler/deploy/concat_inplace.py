"""Channel concats written in place: each input's producer writes straight into its slice of the
concat's buffer, and the concat itself copies nothing.

A ``Concat`` of one image (``outer == 1``: a channel concat at batch 1, NCHW or of whole blocks)
lays its inputs end to end, so input ``k`` is the byte range after inputs ``0..k-1``. When every
input is the output of a kernel step in the native program, of exactly that size (no slack the
kernel may write past it) and at a 64-byte aligned offset, the memory plan places those outputs
there (``ModelPlan``) and the concat step becomes a view: SqueezeNet's fire modules, DenseNet's
dense blocks and the like then move no bytes between layers to concatenate.

DenseNet concatenates the same growing list over and over (layer ``i`` reads ``[x, f1 .. fi]``):
the largest concat of a list claims the inputs, and each concat whose inputs are a prefix of an
already placed list, in the same order and from its start, is a view of that buffer's first
bytes. A tensor is placed once: a concat that would need it somewhere else copies as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from schedule_templates.ops.movement import Concat
from tuner_service.compiler.deploy.generated_step import GeneratedStep
from tuner_service.compiler.deploy.kernel_step import ArgKind, KernelStep

#: a placed input's byte offset must keep the kernels' aligned vector stores aligned
ALIGN_BYTES = 64


@dataclasses.dataclass(frozen=True)
class InPlaceConcats:
    """``placed``: tensor -> (root concat output, byte offset in it); ``views``: concat step
    index -> its output, for every concat no longer computed (a root's own step included);
    ``root_bytes``: each root's size."""

    placed: dict[str, tuple[str, int]]
    views: dict[int, str]
    root_bytes: dict[str, int]


def plan_in_place(steps: Sequence[Any]) -> InPlaceConcats:
    producers = {step.outputs[0]: step for step in steps
                 if isinstance(step, KernelStep) and step.in_program and step.outputs}
    candidates = []
    for index, step in enumerate(steps):
        parts = _parts(step, producers)
        if parts is not None:
            candidates.append((index, step, parts))
    placed: dict[str, tuple[str, int]] = {}
    views: dict[int, str] = {}
    root_bytes: dict[str, int] = {}
    # the longest lists first: a shorter list that is its prefix becomes a view of it
    for index, step, parts in sorted(candidates, key=lambda c: (-len(c[2]), c[0])):
        output = step.outputs[0]
        if output in placed:  # an input of a concat placed already: it copies into its slice
            continue
        names = [name for name, _ in parts]
        if all(name not in placed for name in names):
            offset = 0
            for name, size in parts:
                placed[name] = (output, offset)
                offset += size
            placed[output] = (output, 0)
            root_bytes[output] = offset
            views[index] = output
        elif _is_prefix(parts, placed):
            root = placed[names[0]][0]
            placed[output] = (root, 0)
            views[index] = output
    return InPlaceConcats(placed, views, root_bytes)


def _parts(step: Any, producers: dict[str, KernelStep]) -> list[tuple[str, int]] | None:
    """(input, bytes) of a concat that can be written in place, else None."""
    if not (isinstance(step, GeneratedStep) and isinstance(step.op, Concat)
            and step.op.outer == 1):
        return None
    reads = [a for a in step.args if a.kind in (ArgKind.ACTIVATION, ArgKind.STAGED)]
    if len(reads) != len(step.op.widths) or any(a.kind is not ArgKind.ACTIVATION
                                                for a in reads):
        return None  # a constant input, or one the kernel over-reads
    names = [str(a.tensor) for a in reads]
    if len(set(names)) != len(names) or step.outputs[0] in names:
        return None
    parts, offset = [], 0
    for name, width in zip(names, step.op.widths, strict=True):
        producer = producers.get(name)
        if (producer is None or producer.output_elements != width
                or producer.output_dtype != step.output_dtype or offset % ALIGN_BYTES):
            return None
        size = width * producer.output_dtype.itemsize
        parts.append((name, size))
        offset += size
    return parts


def _is_prefix(parts: list[tuple[str, int]], placed: dict[str, tuple[str, int]]) -> bool:
    """Whether ``parts`` lie in one placed buffer from its start, in order and back to back."""
    first = placed.get(parts[0][0])
    if first is None:
        return False
    root, offset = first[0], 0
    for name, size in parts:
        if placed.get(name) != (root, offset):
            return False
        offset += size
    return True


class PlacedConcat:
    """What stands in the step list for a concat written in place: a step-by-step run puts its
    buffer (a view of the arena the plan gives) in the environment; it computes nothing."""

    in_program = False

    def __init__(self, step: GeneratedStep, view: Any) -> None:
        self.layer = step.layer
        self.op = step.op
        self.inputs = list(step.inputs)
        self.outputs = list(step.outputs)
        self._view = view

    def __call__(self, env: dict[str, Any]) -> None:
        env[self.outputs[0]] = self._view
