"""Features of a lowered loop nest, for the learned cost model.

The vector describes the kernel, not the knob values, so that it means the same thing across
shapes of one template: a model trained on one workload scores configs of another. It has three
blocks, every count log-scaled as ``log2(1 + x)``:

- globals: arithmetic executed (adds, muls, FMAs, min/max, selects, index ops), loads and stores
  executed, parallel / GPU block / GPU thread extents, vector width, unrolled body size, local,
  shared and workspace memory;
- the main statement (the store executing the most arithmetic: the reduction update), one slot
  per loop around it, innermost first so the register-tile loops line up across templates: extent,
  nest level, kind (serial, parallel, vectorize, unroll, each GPU binding), products of the extents
  above and below, and for each buffer access its stride along that loop, the elements it touches
  within one run of the loop (footprint) and how often each is reused there;
- one slot per access of the main statement (the store first, then loads in order): scope, count,
  buffer size, innermost and vector-lane stride, footprint of the whole nest.

``FeatureExtractor`` lowers configs of one (template, workload), appends knob values and caches
rows by config index. Extraction is deterministic: the same config always gives the same vector.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from schedule_templates.errors import InvalidConfigError
from schedule_templates.ir.nodes import Kernel, Loop, LoopKind, Scope
from schedule_templates.kernel_stats import OPS, Access, Statement, statements, store_accesses
from schedule_templates.space import ConfigSpace, SplitKnob

#: bump when the layout or meaning of the vector changes (saved models record it)
FEATURE_VERSION = 1
LOOP_SLOTS = 10
ACCESS_SLOTS = 5
LOOP_KINDS = tuple(LoopKind)
SCOPES = tuple(Scope)
_BLOCKS = (LoopKind.BLOCK_X, LoopKind.BLOCK_Y, LoopKind.BLOCK_Z)
_THREADS = (LoopKind.THREAD_X, LoopKind.THREAD_Y, LoopKind.THREAD_Z)
# keyed by the enum value: hashing an Enum member runs Python code, a str hash does not
_KIND_HOT = {kind.value: tuple(float(kind is k) for k in LOOP_KINDS) for kind in LOOP_KINDS}
_SCOPE_HOT = {scope.value: tuple(float(scope is s) for s in SCOPES) for scope in SCOPES}


# --- the vector (raw values; ``_LOGGED`` positions are log-scaled at the end) ------------------

def _footprints(access: Access, loops: tuple[Loop, ...]) -> list[float]:
    """Elements the access touches within one full run of each loop (outermost first):
    the product of the extents it moves with, capped by the span of its affine offsets."""
    out = [0.0] * len(loops)
    count, span, opaque = 1, 0, False
    for j in range(len(loops) - 1, -1, -1):
        lp = loops[j]
        if lp.var in access.opaque:
            opaque, count = True, count * lp.extent
        elif access.coeffs.get(lp.var, 0):
            count *= lp.extent
            span += abs(access.coeffs[lp.var]) * (lp.extent - 1)
        out[j] = float(count if opaque else min(count, span + 1))
    return out


def _loop_block(loops: tuple[Loop, ...], accesses: list[Access],
                prints: list[list[float]]) -> list[float]:
    depth = len(loops)
    extents = [lp.extent for lp in loops]
    above = [math.prod(extents[:j]) for j in range(depth)]
    below = [math.prod(extents[j + 1:]) for j in range(depth)]
    missing = [0.0, 0.0, 0.0] * (ACCESS_SLOTS - len(accesses))
    out: list[float] = []
    for slot in range(LOOP_SLOTS):
        j = depth - 1 - slot
        if j < 0:
            out += [0.0] * _LOOP_WIDTH
            continue
        lp = loops[j]
        inside = extents[j] * below[j]
        out += [1.0, float(j), float(lp.extent), *_KIND_HOT[lp.kind._value_],
                float(above[j]), float(below[j])]
        for access, fp in zip(accesses, prints, strict=True):
            out += [access.stride(lp.var), fp[j], inside / fp[j] - 1.0]
        out += missing
    return out


def _access_block(trips: int, loops: tuple[Loop, ...], accesses: list[Access],
                  prints: list[list[float]]) -> list[float]:
    vector = [lp for lp in loops if lp.kind is LoopKind.VECTORIZE]
    out: list[float] = []
    for access, fp in zip(accesses, prints, strict=True):
        out += [1.0, float(access.write), *_SCOPE_HOT[access.buffer.scope._value_], float(trips),
                float(access.buffer.size),
                access.stride(loops[-1].var) if loops else 0.0,
                access.stride(vector[-1].var) if vector else 0.0,
                fp[0] if loops else 1.0]
    return out + [0.0] * (_ACCESS_WIDTH * (ACCESS_SLOTS - len(accesses)))


def _global_block(stmts: list[Statement], main: Statement, memory: dict[str, int],
                  kernel: Kernel) -> list[float]:
    totals = [0] * len(OPS)
    loads = stores = 0
    for st in stmts:
        trips = st.trips
        for op, n in enumerate(st.ops):
            totals[op] += n * trips
        loads += st.loads * trips
        stores += trips
    extent = dict.fromkeys(_KIND_HOT, 0)  # 0 when absent, else the product of extents
    for lp in main.loops:
        kind = lp.kind._value_
        extent[kind] = max(extent[kind], 1) * lp.extent
    tail = 1  # the innermost run of unrolled / vectorized loops: one straight-line body
    for lp in reversed(main.loops):
        if lp.kind not in (LoopKind.UNROLL, LoopKind.VECTORIZE):
            break
        tail *= lp.extent
    blocks = math.prod(max(extent[k.value], 1) for k in _BLOCKS)
    threads = math.prod(max(extent[k.value], 1) for k in _THREADS)
    return [
        *map(float, totals), float(loads), float(stores), float(main.trips),
        float(sum(st.trips for st in stmts) - main.trips),
        float(len(stmts)), float(len(main.loops)), float(main.guards),
        float(extent["parallel"]), float(blocks), float(threads),
        float(extent["vectorize"]), float(extent["unroll"]), float(tail),
        float(memory.get("local", 0)), float(memory.get("shared", 0)),
        float(sum(b.size for b in kernel.workspace)), float(memory.get("barrier", 0)),
    ]


_GLOBAL_NAMES = [
    *(f"ops.{op}" for op in OPS), "loads", "stores", "main.trips", "other.trips",
    "statements", "main.depth", "main.guards", "parallel", "gpu.blocks", "gpu.threads",
    "vector", "unroll", "unrolled_body", "mem.local", "mem.shared", "mem.workspace",
    "barriers",
]
_LOOP_FIELDS = ["present", "level", "extent", *(f"kind.{k.value}" for k in LOOP_KINDS),
                "above", "below",
                *(f"a{a}.{f}" for a in range(ACCESS_SLOTS)
                  for f in ("stride", "footprint", "reuse"))]
_ACCESS_FIELDS = ["present", "write", *(f"scope.{s.value}" for s in SCOPES), "count",
                  "buffer", "stride.inner", "stride.vector", "footprint"]
_LOOP_WIDTH = len(_LOOP_FIELDS)
_ACCESS_WIDTH = len(_ACCESS_FIELDS)
KERNEL_NAMES: tuple[str, ...] = (
    *_GLOBAL_NAMES,
    *(f"loop{s}.{f}" for s in range(LOOP_SLOTS) for f in _LOOP_FIELDS),
    *(f"access{a}.{f}" for a in range(ACCESS_SLOTS) for f in _ACCESS_FIELDS),
)
KERNEL_WIDTH = len(KERNEL_NAMES)
_RAW = ("present", "level", "kind.", "scope.", "write", "statements", "main.depth",
        "main.guards")
#: positions holding counts, extents, strides or footprints: these become log2(1 + x)
_LOGGED = np.array([not any(part in name for part in _RAW) for name in KERNEL_NAMES])


def kernel_features(kernel: Kernel) -> np.ndarray:
    """The fixed-length (``KERNEL_WIDTH``) feature vector of one lowered kernel."""
    stmts, memory = statements(kernel.body)
    if not stmts:
        return np.zeros(KERNEL_WIDTH, dtype=np.float32)
    main = max(stmts, key=lambda st: st.work)  # max keeps the first of equals
    accesses = store_accesses(main, ACCESS_SLOTS)
    prints = [_footprints(a, main.loops) for a in accesses]
    raw = np.array([*_global_block(stmts, main, memory, kernel),
                    *_loop_block(main.loops, accesses, prints),
                    *_access_block(main.trips, main.loops, accesses, prints)])
    # opaque strides are -1: log2(1 + x) would be -inf there, so they stay -1
    scaled = np.log2(1.0 + np.maximum(raw, 0.0))
    return np.where(_LOGGED & (raw >= 0.0), scaled, raw).astype(np.float32)


# --- knob values and the per-workload extractor -----------------------------------------------

def knob_names(space: ConfigSpace) -> list[str]:
    out: list[str] = []
    for knob in space.knobs:
        if isinstance(knob, SplitKnob):
            out += [f"knob.{knob.name}.{p}" for p in range(knob.parts)]
        else:
            out.append(f"knob.{knob.name}")
    return out


def knob_features(space: ConfigSpace, index: int) -> list[float]:
    """Split factors log-scaled, other knobs as the position of their choice."""
    out: list[float] = []
    for knob, digit in zip(space.knobs, space.digits(index), strict=True):
        if isinstance(knob, SplitKnob):
            out += [math.log2(f) for f in knob.entities[digit]]
        else:
            out.append(float(digit))
    return out


class FeatureExtractor:
    """Feature rows of one (template, workload) by config index, cached.

    A row is NaN when the config is filtered out by the space or the template refuses to lower
    it. Rows of two workloads of one template have the same width and meaning."""

    def __init__(self, template: Any, workload: Any, space: ConfigSpace | None = None,
                 knobs: bool = True, cache_size: int = 8192) -> None:
        self.template = template
        self.workload = workload
        self.space = space if space is not None else template.space(workload)
        self.knobs = knobs
        self.cache_size = cache_size
        self._cache: dict[int, np.ndarray | None] = {}

    @property
    def names(self) -> list[str]:
        return [*KERNEL_NAMES, *(knob_names(self.space) if self.knobs else [])]

    @property
    def width(self) -> int:
        return len(self.names)

    def row(self, index: int) -> np.ndarray | None:
        """The feature vector of one config, or None when it cannot run."""
        if index in self._cache:
            return self._cache[index]
        row: np.ndarray | None = None
        if self.space.is_valid(index):
            try:
                kernel = self.template.lower(self.workload, self.space.get(index))
            except InvalidConfigError:
                kernel = None
            if kernel is not None:
                row = kernel_features(kernel)
                if self.knobs:
                    row = np.concatenate(
                        [row, np.asarray(knob_features(self.space, index), dtype=np.float32)])
        if len(self._cache) >= self.cache_size:
            for stale in list(self._cache)[: self.cache_size // 2]:
                del self._cache[stale]
        self._cache[index] = row
        return row

    def features(self, indices: Sequence[int]) -> np.ndarray:
        """An ``(len(indices), width)`` float32 matrix; rows of configs that cannot run are NaN."""
        out = np.full((len(indices), self.width), np.nan, dtype=np.float32)
        for i, index in enumerate(indices):
            row = self.row(int(index))
            if row is not None:
                out[i] = row
        return out
