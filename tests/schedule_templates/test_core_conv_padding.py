"""Convs over output extents without a useful divisor compute padded tiles, store real outputs."""

from __future__ import annotations

import numpy as np
import pytest

from schedule_templates.runtime import build
from schedule_templates.space import Config
from schedule_templates.templates.base import get_template
from schedule_templates.templates.choose import padded_spatial
from schedule_templates.workloads import Workload, parse_workload

CASES = [
    "conv2d:N=1,C=5,H=55,W=55,K=16,R=1,S=1",
    "conv2d:N=1,C=4,H=55,W=55,K=16,R=3,S=3,pad=1,epilogue=bias+relu",
    "conv2d:N=2,C=3,H=27,W=27,K=8,R=3,S=3,pad=1,epilogue=bias+residual",
    "conv2d:N=1,C=3,H=28,W=28,K=16,R=3,S=3,stride=2,epilogue=bias+relu",  # 13 x 13 out
    "conv2d:N=1,C=8,H=13,W=27,K=24,R=3,S=1,stride=2x1,pad=1",  # 7 x 27 out
    "conv2d:N=1,C=4,H=223,W=13,K=16,R=3,S=3,stride=2,epilogue=bias",  # 111 x 6 out
    "conv2d:N=1,C=16,H=13,W=13,K=32,R=3,S=3,pad=1,epilogue=bias+relu",  # Winograd eligible
    "conv2d:N=1,C=3,H=1,W=55,K=16,R=1,S=3",  # 1 x 53 out
]


def test_padded_spatial() -> None:
    assert [padded_spatial(e) for e in (55, 27, 13, 111)] == [56, 28, 14, 112]
    assert [padded_spatial(e) for e in (56, 28, 14, 7, 12, 60)] == [56, 28, 14, 7, 12, 60]
    assert [padded_spatial(e) for e in (1, 5, 8, 17, 53)] == [1, 5, 8, 18, 54]


def _picks(wl: Workload, rng: np.random.Generator) -> list[Config]:
    """The default and four random valid configs (every direct one of a padded extent shifts
    its last tile; Winograd ones read the padded extent's divisors as tile counts)."""
    template = get_template(wl.op)
    space = template.space(wl)
    indices = [i for i in (space.random_index(rng) for _ in range(400)) if space.is_valid(i)]
    return [template.default_config(wl), *(space.get(i) for i in indices[:4])]


@pytest.mark.parametrize("key", CASES)
def test_padded_conv_matches_reference(key: str) -> None:
    wl = parse_workload(key)
    template = get_template(wl.op)
    rng = np.random.default_rng(11)
    inputs = wl.make_inputs(5)
    expected = wl.reference(inputs)
    for threads, config in enumerate(_picks(wl, rng)):
        artifact = build(wl, template, config, threads=1 + threads % 2)
        try:
            prepared = artifact.prepare(inputs)
            prepared.output[...] = np.nan  # an output the kernel misses stays NaN
            prepared.run()
            np.testing.assert_allclose(prepared.output, expected, rtol=1e-4, atol=1e-4,
                                       err_msg=str(config.entities))
        finally:
            artifact.close()


def test_the_default_tiles_an_extent_without_divisors_by_a_register_tile() -> None:
    wl = parse_workload("conv2d:N=1,C=64,H=55,W=55,K=64,R=1,S=1")
    config = get_template("conv2d").default_config(wl)
    owo, owt = config["tile_ow"]
    assert owo * owt == 56 and 4 <= owt <= 14
