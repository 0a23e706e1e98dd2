"""GEMMs over an axis without a useful divisor compute padded tiles and store only real data."""

from __future__ import annotations

import numpy as np
import pytest

from schedule_templates.runtime import build
from schedule_templates.templates.base import get_template
from schedule_templates.templates.x86_gemm import padded_extent
from schedule_templates.workloads import parse_workload

CASES = [
    "dense:M=37,N=48,K=40",
    "dense:M=37,N=32,K=24,epilogue=bias+residual+gelu",
    "batch_matmul:B=3,M=19,N=23,K=8",
    "batch_matmul:B=2,M=29,N=16,K=29",
    "batch_matmul:B=2,M=16,N=29,K=5",
]


def test_padded_extent() -> None:
    assert padded_extent(197) == 200
    assert padded_extent(196) == 196  # 4, 7 and 14 divide it
    assert padded_extent(13) == 13  # small: a single tile
    assert padded_extent(1) == 1


@pytest.mark.parametrize("key", CASES)
@pytest.mark.parametrize("threads", [1, 2])
def test_padded_gemm_matches_reference(key: str, threads: int) -> None:
    wl = parse_workload(key)
    template = get_template(wl.op)
    space = template.space(wl)
    rng = np.random.default_rng(7)
    inputs = {n: rng.standard_normal(s).astype(np.float32) for n, s in wl.input_shapes().items()}
    expected = wl.reference(inputs)
    picks = [template.default_config(wl)]
    indices = [space.random_index(rng) for _ in range(64)]
    picks += [space.get(i) for i in indices if space.is_valid(i)][:4]
    for config in picks:
        prepared = build(wl, template, config, threads=threads).prepare(inputs)
        prepared.output[...] = np.nan
        prepared.run()
        np.testing.assert_allclose(prepared.output, expected, rtol=2e-5, atol=2e-5,
                                   err_msg=str(config.entities))
