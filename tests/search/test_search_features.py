"""Loop-nest features: deterministic, fixed-length across workloads, meaningful values."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from schedule_templates.features import (
    KERNEL_NAMES,
    KERNEL_WIDTH,
    FeatureExtractor,
    kernel_features,
    knob_names,
)
from schedule_templates.ir.nodes import (
    Allocate,
    Barrier,
    Buffer,
    Const,
    Kernel,
    LoopKind,
    Scope,
    loop,
    store,
)
from schedule_templates.templates.base import all_templates, get_template
from schedule_templates.workloads import parse_workload, workload_class

#: a small workload of each operator; two shapes each so widths can be compared
SHAPES = {
    "dense": ["dense:M=64,N=64,K=64", "dense:M=1,N=1000,K=512"],
    "batch_matmul": ["batch_matmul:B=2,M=32,N=48,K=16", "batch_matmul:B=12,M=128,N=128,K=64"],
    "conv2d": ["conv2d:N=1,C=16,H=14,W=14,K=32,R=3,S=3,pad=1",
               "conv2d:N=1,C=64,H=28,W=28,K=128,R=1,S=1,stride=2"],
    "depthwise_conv2d": ["depthwise_conv2d:N=1,C=16,H=28,W=28,R=3,S=3,pad=1",
                         "depthwise_conv2d:N=1,C=32,H=14,W=14,R=3,S=3,stride=2,pad=1"],
}


def value(row: np.ndarray, name: str) -> float:
    return float(row[KERNEL_NAMES.index(name)])


def extractor(key: str, target: str = "llvm") -> FeatureExtractor:
    workload = parse_workload(key)
    return FeatureExtractor(get_template(workload.op, target), workload)


@pytest.mark.parametrize("template", all_templates(), ids=lambda t: t.name)
def test_every_template_gives_fixed_length_finite_rows(template: object) -> None:
    rows = []
    op = template.op  # type: ignore[attr-defined]
    for key in SHAPES.get(op) or workload_class(op).examples[:2]:
        workload = parse_workload(key)
        fx = FeatureExtractor(template, workload)
        indices = fx.space.sample(6, np.random.default_rng(0))
        indices.append(template.default_config(workload).index)  # type: ignore[attr-defined]
        x = fx.features(indices)
        assert x.shape == (len(indices), fx.width)
        assert np.isfinite(x).all()
        assert fx.names[:KERNEL_WIDTH] == list(KERNEL_NAMES)
        rows.append((fx.width, fx.names))
    assert rows[0] == rows[1]  # two shapes of one template: same layout, same meaning


def test_same_config_same_vector_across_extractors_and_lowerings() -> None:
    key = "conv2d:N=1,C=16,H=14,W=14,K=32,R=3,S=3,pad=1"
    a, b = extractor(key), extractor(key)
    indices = a.space.sample(20, np.random.default_rng(3))
    first = a.features(indices)
    again = b.features(list(reversed(indices)))[::-1]
    assert np.array_equal(first, again)
    assert np.array_equal(first, a.features(indices))  # cached rows are the same rows
    config = a.space.get(indices[0])
    k1 = a.template.lower(a.workload, config)
    k2 = a.template.lower(a.workload, config)
    assert np.array_equal(kernel_features(k1), kernel_features(k2))


def test_different_configs_mostly_different_vectors() -> None:
    fx = extractor("dense:M=64,N=64,K=64")
    fx.knobs = False  # the loop-nest part alone must tell configs apart
    indices = fx.space.sample(60, np.random.default_rng(1))
    rows = {fx.row(i).tobytes() for i in indices}  # type: ignore[union-attr]
    assert len(rows) >= 0.9 * len(indices)


def test_invalid_config_is_a_nan_row() -> None:
    fx = extractor("dense:M=64,N=64,K=64")
    invalid = next(i for i in range(fx.space.size) if not fx.space.is_valid(i))
    valid = fx.space.sample(1, np.random.default_rng(0))[0]
    x = fx.features([invalid, valid])
    assert np.isnan(x[0]).all()
    assert np.isfinite(x[1]).all()
    assert fx.row(invalid) is None


def test_gemm_values_match_the_loop_nest() -> None:
    """dense 64^3 with tile_m (1,16,4), tile_n (1,1,64), tile_k (1,16,4)."""
    fx = extractor("dense:M=64,N=64,K=64")
    config = fx.space.from_entities({"tile_m": (1, 16, 4), "tile_n": (1, 1, 64),
                                     "tile_k": (1, 16, 4), "outer_order": "nm",
                                     "inner_order": "nm"})
    row = fx.row(config.index)
    assert row is not None
    log = lambda x: math.log2(1 + x)  # noqa: E731
    assert value(row, "ops.fma") == pytest.approx(log(64 ** 3))  # one FMA per MAC
    assert value(row, "ops.mul") == 0 and value(row, "ops.add") == 0
    assert value(row, "main.trips") == pytest.approx(log(64 ** 3))
    assert value(row, "vector") == pytest.approx(log(64))
    assert value(row, "mem.local") == pytest.approx(log(4 * 64))
    # innermost loop: the vectorized j over 64 columns of the register tile
    assert value(row, "loop0.kind.vectorize") == 1 and value(row, "loop0.extent") == pytest.approx(
        log(64))
    assert value(row, "loop1.kind.unroll") == 1  # r: the 4 rows of the tile
    # accesses: acc (store), data, weight_packed, acc (load)
    assert value(row, "access0.scope.local") == 1 and value(row, "access0.write") == 1
    assert value(row, "access1.stride.vector") == 0  # data[m, k] is broadcast across lanes
    assert value(row, "access2.stride.vector") == pytest.approx(1.0)  # unit stride: log2(2)
    # data is reused across the 64 vector lanes: footprint 1, reuse 64 within loop j
    assert value(row, "loop0.a1.footprint") == pytest.approx(log(1))
    assert value(row, "loop0.a1.reuse") == pytest.approx(math.log2(64))
    # within m_i (16 iterations of 4 rows, all of K): data touches 64 x 64 elements
    level = {int(value(row, f"loop{s}.level")): s for s in range(8)}
    m_i = level[3]
    assert value(row, f"loop{m_i}.extent") == pytest.approx(log(16))
    assert value(row, f"loop{m_i}.a1.footprint") == pytest.approx(log(64 * 64))


def _direct(ex: Any) -> int:
    """The default config's index with the direct algorithm (a 3x3 default may be Winograd,
    whose transformed tiles are a workspace too)."""
    default = ex.template.default_config(ex.workload)
    chosen = {name: value for name, _kind, value in default.entities}
    space = ex.template.space(ex.workload)
    return int(space.from_entities({**chosen, "algorithm": "direct"}).index)


def test_padding_stage_keeps_layout_but_changes_values() -> None:
    padded = extractor("conv2d:N=1,C=16,H=14,W=14,K=32,R=3,S=3,pad=1")
    plain = extractor("conv2d:N=1,C=16,H=16,W=16,K=32,R=3,S=3")
    a = padded.row(_direct(padded))
    b = plain.row(_direct(plain))
    assert a is not None and b is not None and a.shape == b.shape
    assert value(a, "mem.workspace") > 0 and value(b, "mem.workspace") == 0
    assert value(a, "statements") > value(b, "statements")
    assert value(a, "access1.scope.workspace") == 1 and value(b, "access1.scope.global") == 1


def test_gpu_kinds_on_a_hand_built_kernel() -> None:
    """blockIdx.y/x over tiles, threadIdx.y/x inside, a shared-memory stage and a barrier."""
    a = Buffer("a", (64, 64))
    out = Buffer("out", (64, 64))
    tile = Buffer("tile", (16, 16), Scope.SHARED)
    by, block_y = loop("by", 4, LoopKind.BLOCK_Y)
    bx, block_x = loop("bx", 4, LoopKind.BLOCK_X)
    ty, thread_y = loop("ty", 16, LoopKind.THREAD_Y)
    tx, thread_x = loop("tx", 16, LoopKind.THREAD_X)
    ty2, thread_y2 = loop("ty", 16, LoopKind.THREAD_Y)
    tx2, thread_x2 = loop("tx", 16, LoopKind.THREAD_X)
    body = block_y(block_x(Allocate(tile, (
        thread_y(thread_x(store(tile[ty, tx], a[by * 16 + ty, bx * 16 + tx]))),
        Barrier(),
        thread_y2(thread_x2(store(out[by * 16 + ty2, bx * 16 + tx2],
                                  tile[tx2, ty2] * Const(2.0, "float32") + tile[ty2, tx2]))),
    ))))
    row = kernel_features(Kernel("transpose_add", (a, out), (), (body,)))
    assert row.shape == (KERNEL_WIDTH,)
    log = lambda x: math.log2(1 + x)  # noqa: E731
    assert value(row, "gpu.blocks") == pytest.approx(log(16))
    assert value(row, "gpu.threads") == pytest.approx(log(256))
    assert value(row, "mem.shared") == pytest.approx(log(256))
    assert value(row, "barriers") == pytest.approx(log(16))
    assert value(row, "parallel") == 0
    # main statement (the FMA): innermost first tx, ty, bx, by
    kinds = ["threadIdx.x", "threadIdx.y", "blockIdx.x", "blockIdx.y"]
    for slot, kind in enumerate(kinds):
        assert value(row, f"loop{slot}.kind.{kind}") == 1
        assert value(row, f"loop{slot}.level") == 3 - slot
    assert value(row, "loop4.present") == 0
    assert value(row, "access1.scope.shared") == 1
    # tile[tx, ty] moves 16 elements per threadIdx.x step; tile[ty, tx] one
    assert value(row, "loop0.a1.stride") == pytest.approx(log(16))
    assert value(row, "loop0.a2.stride") == pytest.approx(log(1))
    assert value(row, "loop2.above") == pytest.approx(log(4))
    assert value(row, "loop2.below") == pytest.approx(log(256))


def test_knob_values_are_appended_by_name() -> None:
    fx = extractor("dense:M=64,N=64,K=64")
    names = knob_names(fx.space)
    assert fx.names[KERNEL_WIDTH:] == names
    assert names[:3] == ["knob.tile_m.0", "knob.tile_m.1", "knob.tile_m.2"]
    config = fx.space.from_entities({"tile_m": (1, 16, 4), "tile_n": (1, 1, 64),
                                     "tile_k": (1, 16, 4), "outer_order": "mn",
                                     "inner_order": "nm"})
    row = fx.row(config.index)
    assert row is not None
    assert list(row[KERNEL_WIDTH:KERNEL_WIDTH + 3]) == [0.0, 4.0, 2.0]
    assert row[fx.names.index("knob.outer_order")] == 1.0
