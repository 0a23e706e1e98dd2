"""Depthwise x86: the per-channel stack copy and the whole-tensor workspace copy agree."""

from __future__ import annotations

import numpy as np
import pytest

from schedule_templates.runtime import build
from schedule_templates.templates.base import get_template
from schedule_templates.templates.x86_depthwise import MAX_LOCAL_PLANE, _plane_elements
from schedule_templates.workloads import parse_workload

CASES = [
    # small planes: copied per channel into the thread's stack buffer
    "depthwise_conv2d:N=2,C=5,H=17,W=19,R=3,S=3,stride=2,pad=1",
    "depthwise_conv2d:N=1,C=7,H=9,W=23,R=5,S=5,pad=2,epilogue=bias+relu6",
    "depthwise_conv2d:N=1,C=3,H=10,W=10,R=3,S=3,stride=2,multiplier=2",
    # a plane larger than MAX_LOCAL_PLANE: the workspace copy
    "depthwise_conv2d:N=1,C=2,H=300,W=260,R=3,S=3,pad=1",
]


@pytest.mark.parametrize("key", CASES)
@pytest.mark.parametrize("parallel_rows", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_matches_reference(key: str, parallel_rows: bool, threads: int) -> None:
    wl = parse_workload(key)
    template = get_template(wl.op)
    default = template.default_config(wl)
    chosen = {name: value for name, _kind, value in default.entities}
    config = template.space(wl).from_entities({**chosen, "parallel_rows": parallel_rows})
    rng = np.random.default_rng(3)
    inputs = {n: rng.standard_normal(s).astype(np.float32)
              for n, s in wl.input_shapes().items()}
    artifact = build(wl, template, config, threads=threads)
    prepared = artifact.prepare(inputs)
    prepared.run()
    np.testing.assert_allclose(prepared.output, wl.reference(inputs), rtol=1e-5, atol=1e-5)


def test_large_planes_use_the_workspace() -> None:
    big = parse_workload(CASES[-1])
    small = parse_workload(CASES[0])
    assert _plane_elements(big) > MAX_LOCAL_PLANE >= _plane_elements(small)
    template = get_template("depthwise_conv2d")
    assert template.lower(big, template.default_config(big)).workspace
    assert not template.lower(small, template.default_config(small)).workspace
