"""Write a model's native program and packed weights, so that C can run it without Python.

``tuner build --standalone`` binds the model once (packing every weight with its template, as
``tuner run`` does), plans its buffers, and writes two files beside ``libmodel.so``:

- ``model.program``: the records of ``native.ModelPlan`` with kernels named by symbol and every
  pointer as (region, byte offset): the planned activation arena, the shared scratch, or the
  weights blob; the inputs' and outputs' names, sizes and arena offsets; the thread count; the
  sizes of the three regions and a hash of the weights. It ends with a checksum of all of
  it, so a truncated or corrupted file is refused rather than run.
- ``model.weights``: the blob (packed weights and the over-reading kernels' staging buffers,
  each 64-byte aligned).

The library's ``tuner_model_load`` reads them (``native_runtime.c``, ``docs/native.md``). Only a
model whose every step is a kernel or a view can be written: a numpy step has no C form.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner_service.compiler.deploy.feeds import InputSpec
from tuner_service.compiler.deploy.memory_plan import aligned
from tuner_service.compiler.deploy.native import ModelPlan, NativeError, Record, Ref, Region

if TYPE_CHECKING:
    from tuner_service.compiler.frontend.loading import ModelInput
    from tuner_service.compiler.frontend.shapes import InputShapes

PROGRAM_FILE = "model.program"
WEIGHTS_FILE = "model.weights"
PROGRAM_VERSION = 1


def export_model(model: ModelInput, directory: Path, threads: int | None = None,
                 input_shapes: InputShapes | None = None) -> dict[str, Any]:
    """Bind ``model`` to the library in ``directory`` and write its program and weights."""
    from tuner_service.compiler.deploy.executor import ModelRunner
    from tuner_service.compiler.deploy.loader import KernelLibrary

    runner = ModelRunner(model, KernelLibrary(directory), threads, input_shapes, native=False)
    return write_program(runner.plan, runner.input_specs, runner.threads, directory)


def write_program(plan: ModelPlan, inputs: Sequence[InputSpec], threads: int,
                  directory: Path) -> dict[str, Any]:
    """Write ``model.program`` and ``model.weights``; NativeError if the model has steps that
    only Python can run, or inputs the C entry point cannot take."""
    python = sorted({getattr(getattr(s, "info", None), "op_type", type(s).__name__)
                     for s in plan.python_steps()})
    if python:
        raise NativeError(f"the model has steps that run in numpy ({', '.join(python)}); a "
                          "standalone program needs every step to be a kernel or a view")
    records = [r for segment in plan.segments for r in segment.records]
    weights, where = _weights_blob(records)
    symbols: dict[str, int] = {}
    for record in records:
        if record.step is not None:
            symbols.setdefault(record.step.kernel.symbol, len(symbols))
    out = _Writer()
    out.raw(b"TUNERPRG")
    out.ints(PROGRAM_VERSION, threads, len(weights), plan.memory.arena_bytes,
             plan.scratch.buffer.size * 4)
    out.raw(struct.pack("<Q", checksum(weights)))
    out.ints(len(symbols))
    for symbol in symbols:
        out.name(symbol)
    _write_inputs(out, plan, inputs)
    _write_outputs(out, plan)
    _write_records(out, plan, records, symbols, where)
    program = bytes(out.data)
    (directory / PROGRAM_FILE).write_bytes(program + struct.pack("<Q", checksum(program)))
    (directory / WEIGHTS_FILE).write_bytes(b"TUNERWGT" + struct.pack("<q", len(weights))
                                           + weights)
    return {"program": str(directory / PROGRAM_FILE), "weights": str(directory / WEIGHTS_FILE),
            "records": len(records), "weights_bytes": len(weights), "threads": threads,
            "memory": plan.memory.summary()}


def _write_inputs(out: _Writer, plan: ModelPlan, inputs: Sequence[InputSpec]) -> None:
    out.ints(len(inputs))
    for spec in inputs:
        external = plan.externals.get(spec.name)
        if spec.dtype != np.float32 or spec.static_shape is None or external is None:
            why = ("is not float32" if spec.dtype != np.float32 else "has a dynamic shape"
                   if spec.static_shape is None else "is not read by a kernel")
            raise NativeError(f"input {spec.name!r} {why}: the C entry point takes static fp32 "
                              "inputs that kernels read")
        out.name(spec.name)
        out.ints(external.elements, plan.staging_ref(spec.name).offset)


def _write_outputs(out: _Writer, plan: ModelPlan) -> None:
    out.ints(len(plan.outputs))
    for name in plan.outputs:
        if name not in plan.roots:
            raise NativeError(f"output {name!r} is not computed by a kernel")
        out.name(name)
        out.ints(plan.views[name].size, plan.offset_of(name))


def _write_records(out: _Writer, plan: ModelPlan, records: Sequence[Record],
                   symbols: dict[str, int], where: dict[int, int]) -> None:
    out.ints(len(records), sum(len(r.args) for r in records))
    for record in records:
        index = -1 if record.step is None else symbols[record.step.kernel.symbol]
        out.ints(int(record.kind), index, record.aux, len(record.args))
        for arg in record.args:
            ref = plan.staging_ref(arg) if isinstance(arg, str) else arg
            out.ints(int(ref.region), ref.offset if ref.buffer is None
                     else where[ref.buffer.ctypes.data])


def _weights_blob(records: Sequence[Record]) -> tuple[bytes, dict[int, int]]:
    """Every buffer a WEIGHTS ref names, once, 64-byte aligned; address -> offset."""
    where: dict[int, int] = {}
    parts: list[bytes] = []
    size = 0
    for record in records:
        for arg in record.args:
            if not isinstance(arg, Ref) or arg.region is not Region.WEIGHTS:
                continue
            assert arg.buffer is not None
            if arg.buffer.ctypes.data in where:
                continue
            where[arg.buffer.ctypes.data] = size
            data = np.ascontiguousarray(arg.buffer).tobytes()  # typed: int8 steps' bytes
            parts.append(data + bytes(aligned(len(data)) - len(data)))
            size += aligned(len(data))
    return b"".join(parts), where


def checksum(data: bytes) -> int:
    """The files' checksum, as native_runtime.c computes it: the data zero-padded to 8-byte
    little-endian words w, sum of w[i] * (2i + 1) modulo 2**64, xor the length. Any one changed
    word changes it (odd factors are invertible), and so does a truncation."""
    padded = data + bytes(-len(data) % 8)
    words = np.frombuffer(padded, dtype="<u8")
    factors = np.arange(words.size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    with np.errstate(over="ignore"):
        total = int(np.sum(words * factors, dtype=np.uint64))
    return total ^ len(data)


class _Writer:
    """Little-endian int64s and length-prefixed UTF-8 names."""

    def __init__(self) -> None:
        self.data = bytearray()

    def raw(self, data: bytes) -> None:
        self.data += data

    def ints(self, *values: int) -> None:
        self.data += struct.pack(f"<{len(values)}q", *values)

    def name(self, text: str) -> None:
        encoded = text.encode()
        self.ints(len(encoded))
        self.data += encoded
