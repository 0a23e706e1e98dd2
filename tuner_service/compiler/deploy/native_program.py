"""The native program of a planned model (``native.ModelPlan``) resolved to this process's
pointers: the C records ``native_runtime.c`` walks, one ctypes call per kernel segment, and the
binding of feeds and Python steps' outputs at each run."""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from tuner_service.compiler.deploy.errors import LibraryError
from tuner_service.compiler.deploy.native import (
    External,
    ModelPlan,
    NativeError,
    Record,
    Ref,
    Region,
    Segment,
)


class _CRecord(ctypes.Structure):
    _fields_ = [("function", ctypes.c_void_p), ("kind", ctypes.c_int64),
                ("argc", ctypes.c_int64), ("aux", ctypes.c_int64),
                ("args", ctypes.c_void_p)]


class NativeProgram:
    """The plan's records resolved to this process's pointers: ``run(env)`` executes the model
    with one C call per kernel segment."""

    def __init__(self, plan: ModelPlan, library: Path) -> None:
        self.plan = plan
        try:
            lib = ctypes.CDLL(str(library.resolve()))
            self._run_program = lib.tuner_program_run
            max_args = int(lib.tuner_max_args())
        except (OSError, AttributeError) as e:
            raise NativeError(f"{library.name} has no native runtime (built by an older tuner; "
                              "rebuild it with tuner build)") from e
        self._run_program.argtypes = [ctypes.c_void_p, ctypes.c_int64]
        self._run_program.restype = ctypes.c_int
        records = [r for s in plan.segments for r in s.records]
        for record in records:
            if len(record.args) > max_args:
                assert record.step is not None
                raise NativeError(f"kernel {record.step.kernel.symbol} (layer {record.step.layer})"
                                  f" takes {len(record.args)} pointer arguments; the native "
                                  f"runtime dispatches at most {max_args}")
        self._c_records = (_CRecord * max(1, len(records)))()
        self._slots = np.zeros(max(1, sum(len(r.args) for r in records)), dtype=np.uint64)
        self._bindings: dict[str, list[int]] = {name: [] for name in plan.externals}
        self._staging: dict[int, list[External]] = {}
        for external in plan.externals.values():
            self._staging.setdefault(external.segment, []).append(external)
        self._calls: list[tuple[int, int] | Segment] = []
        self._fill(records)

    def _fill(self, records: list[Record]) -> None:
        slot, index = 0, 0
        stride = ctypes.sizeof(_CRecord)
        for segment in self.plan.segments:
            if not segment.native:
                self._calls.append(segment)
                continue
            self._calls.append((ctypes.addressof(self._c_records) + index * stride,
                                len(segment.records)))
            for record in segment.records:
                c = self._c_records[index]
                c.kind, c.argc, c.aux = int(record.kind), len(record.args), record.aux
                if record.step is not None:
                    c.function = ctypes.cast(record.step.kernel.function, ctypes.c_void_p).value
                c.args = self._slots.ctypes.data + 8 * slot
                for arg in record.args:
                    if isinstance(arg, str):
                        self._bindings[arg].append(slot)
                        arg = self.plan.staging_ref(arg)
                    self._slots[slot] = self.address(arg)
                    slot += 1
                index += 1

    def address(self, ref: Ref) -> int:
        if ref.region is Region.WEIGHTS:
            assert ref.buffer is not None
            return int(ref.buffer.ctypes.data)
        base = self.plan.arena if ref.region is Region.ARENA else self.plan.scratch.buffer
        return int(base.ctypes.data) + ref.offset

    def run(self, env: dict[str, np.ndarray]) -> None:
        """Execute every segment; planned tensors that Python steps or outputs read are put
        into ``env`` (views of the arena)."""
        staged = self._stage_segment
        for position, call in enumerate(self._calls):
            if isinstance(call, Segment):
                for name in call.reads:
                    env[name] = self.plan.views[name]
                for step in call.steps:
                    step(env)
                continue
            staged(position, env)
            status = self._run_program(*call)
            if status != 0:
                raise LibraryError(f"the native runtime failed with code {status}")
        for name in self.plan.outputs:
            if name in self.plan.roots:
                env[name] = self.plan.views[name]

    def _stage_segment(self, position: int, env: Mapping[str, np.ndarray]) -> None:
        plan = self.plan
        for external in self._staging.get(position, ()):
            value = env[external.name]
            if (value.dtype == external.dtype and value.flags.c_contiguous
                    and value.size == external.elements):
                pointer = value.ctypes.data  # the feed itself, no copy
            elif value.size == external.elements:
                staging = plan.arena_slice(f"external:{external.name}", external.elements,
                                           external.dtype)
                np.copyto(staging, value.reshape(-1), casting="unsafe")
                pointer = staging.ctypes.data
            else:
                raise LibraryError(f"tensor {external.name} has {value.size} elements, the "
                                   f"kernels that read it expect {external.elements}")
            self._slots[self._bindings[external.name]] = pointer
