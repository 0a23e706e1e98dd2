"""Run a bound model as a few calls into its library instead of one Python step per layer.

After binding, every kernel step is a function pointer and a fixed argument list, except for the
activations it reads. Planning every activation buffer ahead of time (``memory_plan``) fixes
those too, so a run of consecutive kernel steps becomes a *program*: an array of records
``{function, kind, argc, aux, args}`` that the library's C runtime (``native_runtime.c``) walks
in one ctypes call. Python keeps what only it can do: checking the feeds, binding them (a
pointer when the feed is already dense fp32, else a copy into the planned buffer), running the
numpy and reference-evaluator steps (each run of them splits the program into one more
segment), and copying the outputs out.

Pure views (Reshape, Flatten, Squeeze, Unsqueeze, Identity of a buffer the plan owns) do not
split segments: their output is an alias of their input's buffer. So are channel concats that
their inputs' kernels write in place (``concat_inplace``): a tensor then lives at a byte offset
into its root's buffer. A kernel output that a Python step reads lives to the end of the run
(the step may return a view of it), as do graph outputs, so the plan is valid for the
step-by-step path too: both paths share the same buffers and give the same bits.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from schedule_templates.runtime import aligned_empty
from tuner_service.compiler.deploy.concat_inplace import plan_in_place
from tuner_service.compiler.deploy.errors import DeployError
from tuner_service.compiler.deploy.fallback import FallbackStep
from tuner_service.compiler.deploy.kernel_step import (
    FP32,
    ArgKind,
    BoundArg,
    KernelStep,
    Scratch,
)
from tuner_service.compiler.deploy.memory_plan import BufferRequest, plan_memory

#: numpy operators whose output is their first input with another shape (no data moves)
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})


class NativeError(DeployError):
    """The model cannot run as a native program (the step-by-step path still can)."""


class Region(enum.IntEnum):
    """Where an argument points; the numbering is the program file's (native_runtime.c)."""

    WEIGHTS = 0   # memory a kernel step owns: packed weights, staging copies
    ARENA = 1     # the planned activation arena
    SCRATCH = 2   # the workspaces every kernel shares


@dataclasses.dataclass(frozen=True)
class Ref:
    """A pointer: ``offset`` bytes into ``region``; a WEIGHTS ref names its ``buffer``."""

    region: Region
    offset: int
    buffer: np.ndarray | None = None


#: a record argument: a fixed pointer, or the name of a tensor bound at every run
Arg = Ref | str


class Kind(enum.IntEnum):
    CALL = 0
    COPY = 1


@dataclasses.dataclass(frozen=True)
class Record:
    """One kernel call (aux: thread count) or copy (aux: bytes, args: source, destination)."""

    kind: Kind
    args: tuple[Arg, ...]
    aux: int
    step: KernelStep | None = None


@dataclasses.dataclass
class Segment:
    """Consecutive kernel steps (native: run as ``records``) or Python steps; ``reads`` are the
    planned tensors a Python segment needs in its environment."""

    native: bool
    first: int  # index of its first step in the model's step list
    kernels: list[KernelStep] = dataclasses.field(default_factory=list)
    records: list[Record] = dataclasses.field(default_factory=list)
    steps: list[Any] = dataclasses.field(default_factory=list)
    reads: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class External:
    """A tensor from outside the plan (a feed, a Python step's output) that kernels read: it
    gets a staging buffer in the arena, bound at the start of segment ``segment``."""

    name: str
    elements: int
    segment: int
    dtype: np.dtype[Any] = FP32


class ModelPlan:
    """Segments, aliases and the activation arena of one model's steps."""

    def __init__(self, steps: Sequence[Any], outputs: Sequence[str],
                 shapes: Mapping[str, tuple[int, ...]], scratch: Scratch) -> None:
        self.scratch = scratch
        self.outputs = list(outputs)
        self.producers: dict[str, KernelStep] = {}
        self.roots: dict[str, str] = {}  # planned tensor (or alias) -> the tensor it views
        self.offsets_in_root: dict[str, int] = {}  # bytes from its root's start, where not 0
        self.alias_shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, np.dtype[Any]] = {}  # of each root
        self.segments: list[Segment] = []
        self.in_place = plan_in_place(steps)
        self._split(steps, shapes)
        self.externals = self._externals()
        self.root_bytes, self.data_bytes = self._root_sizes()
        #: root -> bytes its buffer spans so that the kernels over-reading it read it in place
        self.read_extent = self._over_reads()
        slacks = [extent - self.data_bytes[root] for root, extent in self.read_extent.items()]
        self._zeros = aligned_empty(max([16] + [(b + 3) // 4 for b in slacks]), zero=True)
        self.memory = plan_memory(self._requests(steps))
        self.arena = aligned_empty(max(16, self.memory.arena_bytes // 4), zero=True)
        for name, step in self.producers.items():
            step.place_output(self.arena_slice(name, step.output_elements, step.output_dtype))
        #: every planned tensor as an array (a view of the arena, in its own shape)
        self.views = {tensor: self._view(tensor) for tensor in self.roots}
        for segment in self.segments:
            segment.records = [r for step in segment.kernels for r in self._records(step)]
            for step in segment.kernels:
                self._bind_in_place(step)

    # -- segments and aliases --------------------------------------------------------------

    def _split(self, steps: Sequence[Any], shapes: Mapping[str, tuple[int, ...]]) -> None:
        placed = self.in_place.placed
        for index, step in enumerate(steps):
            if index in self.in_place.views:  # a concat its inputs' kernels wrote in place
                output = step.outputs[0]
                self._place(output, *placed[output])
                self.alias_shapes[output] = tuple(step.output.shape)
                self.dtypes.setdefault(output, step.output_dtype)
            elif isinstance(step, KernelStep) and step.in_program:
                output = step.outputs[0]
                self.producers[output] = step
                self._place(output, *placed.get(output, (output, 0)))
                self.dtypes.setdefault(self.roots[output], step.output_dtype)
                self._segment(native=True, index=index).kernels.append(step)
            elif self._is_view(step, shapes):
                source = step.inputs[0]
                self._place(step.outputs[0], self.roots[source],
                            self.offsets_in_root.get(source, 0))
                self.alias_shapes[step.outputs[0]] = shapes[step.outputs[0]]
            else:
                segment = self._segment(native=False, index=index)
                segment.steps.append(step)
                segment.reads.extend(n for n in step.inputs if n in self.roots
                                     and n not in segment.reads)

    def _place(self, tensor: str, root: str, offset: int) -> None:
        self.roots[tensor] = root
        if offset:
            self.offsets_in_root[tensor] = offset

    def offset_of(self, tensor: str) -> int:
        """Byte offset of a planned tensor in the arena."""
        return self.memory.offsets[self.roots[tensor]] + self.offsets_in_root.get(tensor, 0)

    def _segment(self, native: bool, index: int) -> Segment:
        if not self.segments or self.segments[-1].native != native:
            self.segments.append(Segment(native, index))
        return self.segments[-1]

    def _is_view(self, step: Any, shapes: Mapping[str, tuple[int, ...]]) -> bool:
        info = getattr(step, "info", None)
        return (info is not None and not isinstance(step, FallbackStep)
                and getattr(step, "fallback", None) is None and info.op_type in VIEW_OPS
                and bool(step.inputs) and step.inputs[0] in self.roots
                and len(step.outputs) == 1 and step.outputs[0] in shapes)

    def _externals(self) -> dict[str, External]:
        """Feeds and Python steps' outputs that kernels read, staged alike."""
        found: dict[str, External] = {}
        for position, segment in enumerate(self.segments):
            for step in segment.kernels:
                for arg in step.args:
                    if arg.kind in (ArgKind.ACTIVATION, ArgKind.STAGED) and arg.tensor not in \
                            self.roots and arg.tensor not in found:
                        found[str(arg.tensor)] = External(str(arg.tensor), arg.size, position,
                                                          arg.dtype)
        return found

    # -- liveness and the arena ------------------------------------------------------------

    def _requests(self, steps: Sequence[Any]) -> list[BufferRequest]:
        end = len(steps)
        written = {name: i for i, s in enumerate(steps) for name in s.outputs if name}
        last: dict[str, int] = {}
        for index, step in enumerate(steps):
            for name in step.inputs:
                root = self.roots.get(name, name)
                if isinstance(step, KernelStep) and step.in_program:
                    last[root] = max(last.get(root, -1), index)
                elif self._is_alias_output(step):
                    continue  # a view reads nothing; its readers count for the root
                elif name in self.roots:  # a Python step may keep a view of it
                    last[root] = end
        for name in self.outputs:
            if name in self.roots:
                last[self.roots[name]] = end
        sizes = dict(self.root_bytes)
        for root, extent in self.read_extent.items():
            sizes[root] = max(sizes[root], extent)
        starts: dict[str, int] = {}  # a root's first write: its own, or a placed input's
        for name, root in self.roots.items():
            if name in written:
                starts[root] = min(starts.get(root, written[name]), written[name])
        requests = [BufferRequest(root, size, starts[root],
                                  max(starts[root], last.get(root, -1)))
                    for root, size in sizes.items()]
        for external in self.externals.values():
            first = self.segments[external.segment].first
            requests.append(BufferRequest(f"external:{external.name}",
                                          external.elements * external.dtype.itemsize,
                                          first, max(first, last.get(external.name, first))))
        return requests

    def _root_sizes(self) -> tuple[dict[str, int], dict[str, int]]:
        """Bytes of each root's buffer, and of its tensor itself (a kernel's output buffer may
        hold slack past the tensor that the kernel writes)."""
        buffers: dict[str, int] = {}
        tensors: dict[str, int] = {}
        for name, step in self.producers.items():
            if self.roots[name] == name:
                buffers[name] = step.output_elements * step.output_dtype.itemsize
                tensors[name] = next((a.nbytes for a in step.args if a.kind is ArgKind.OUTPUT),
                                     buffers[name])
        buffers.update(self.in_place.root_bytes)  # a concat's buffer: its inputs' bytes
        tensors.update(self.in_place.root_bytes)
        return buffers, tensors

    def _reads_in_place(self, arg: BoundArg) -> bool:
        """Whether a staged argument (a kernel that over-reads past the tensor's end) can read
        its tensor in the arena instead of a copy: the tensor is all of a root buffer the plan
        owns, whose request then grows to cover what the kernel reads past it."""
        tensor = str(arg.tensor)
        root = self.roots.get(tensor)
        return (arg.kind is ArgKind.STAGED and root is not None
                and not self.offsets_in_root.get(tensor, 0)
                and self.data_bytes.get(root) == arg.nbytes)

    def _over_reads(self) -> dict[str, int]:
        extent: dict[str, int] = {}
        for segment in self.segments:
            for step in segment.kernels:
                for arg in step.args:
                    if self._reads_in_place(arg):
                        assert arg.buffer is not None
                        root = self.roots[str(arg.tensor)]
                        extent[root] = max(extent.get(root, 0), int(arg.buffer.nbytes))
        return extent

    def _is_alias_output(self, step: Any) -> bool:
        return bool(step.outputs) and step.outputs[0] in self.alias_shapes

    def arena_slice(self, name: str, elements: int, dtype: np.dtype[Any]) -> np.ndarray:
        """``elements`` of ``dtype`` at the planned offset of ``name`` (64-byte aligned)."""
        start = self.offset_of(name) if name in self.roots else self.memory.offsets[name]
        raw = self.arena.view(np.uint8)[start:start + elements * dtype.itemsize]
        return raw.view(dtype)

    def _view(self, tensor: str) -> np.ndarray:
        if tensor in self.producers:
            return self.producers[tensor].output
        shape = self.alias_shapes[tensor]
        dtype = self.dtypes[self.roots[tensor]]
        return self.arena_slice(tensor, int(np.prod(shape)), dtype).reshape(shape)

    # -- records -----------------------------------------------------------------------------

    def tensor_ref(self, tensor: str) -> Arg:
        """A planned tensor's arena pointer; an external's name (bound at run time)."""
        if tensor in self.roots:
            return Ref(Region.ARENA, self.offset_of(tensor))
        return tensor

    def staging_ref(self, external: str) -> Ref:
        return Ref(Region.ARENA, self.memory.offsets[f"external:{external}"])

    def _records(self, step: KernelStep) -> list[Record]:
        records, args = [], []
        for arg in step.args:
            if arg.kind is ArgKind.ACTIVATION:
                args.append(self.tensor_ref(str(arg.tensor)))
                continue
            span = self._in_place_span(arg)
            if span is not None:  # read in place, what it over-reads zeroed as the copy's was
                start, end, read_end = span
                if read_end > end:
                    records.append(Record(Kind.COPY, (Ref(Region.WEIGHTS, 0, self._zeros),
                                                      Ref(Region.ARENA, end)), read_end - end))
                args.append(Ref(Region.ARENA, start))
                continue
            assert arg.buffer is not None
            if arg.kind is ArgKind.OUTPUT:
                ref = Ref(Region.ARENA, self.offset_of(step.outputs[0]))
            elif arg.kind is ArgKind.WORKSPACE:
                ref = Ref(Region.SCRATCH, arg.buffer.ctypes.data - self.scratch.buffer.ctypes.data)
            else:
                ref = Ref(Region.WEIGHTS, 0, arg.buffer)
            if arg.kind is ArgKind.STAGED:  # the over-read copy, in the program itself
                records.append(Record(Kind.COPY, (self.tensor_ref(str(arg.tensor)), ref),
                                      arg.nbytes))
            args.append(ref)
        records.append(Record(Kind.CALL, tuple(args), step.threads, step))
        return records

    def _in_place_span(self, arg: BoundArg) -> tuple[int, int, int] | None:
        """Arena offsets of a tensor read in place: its start, its end, the end of what the
        kernel reads."""
        if not self._reads_in_place(arg):
            return None
        assert arg.buffer is not None
        start = self.offset_of(str(arg.tensor))
        return start, start + arg.nbytes, start + int(arg.buffer.nbytes)

    def _bind_in_place(self, step: KernelStep) -> None:
        """The step path reads what the program reads in place the same way."""
        raw = self.arena.view(np.uint8)
        for position, arg in enumerate(step.args):
            span = self._in_place_span(arg)
            if span is not None:
                start, end, read_end = span
                step.read_in_place(position, raw[start:end], raw[end:read_end])

    def python_steps(self) -> list[Any]:
        return [step for segment in self.segments for step in segment.steps]
