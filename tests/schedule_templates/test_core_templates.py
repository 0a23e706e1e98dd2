"""Every template: random valid configs compile, run and match numpy, on ordinary and odd shapes."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedule_templates.errors import (
    InvalidConfigError,
    InvalidWorkloadError,
    UnsupportedHostError,
)
from schedule_templates.records import ErrorKind
from schedule_templates.runtime import build
from schedule_templates.templates.base import all_templates, get_template
from schedule_templates.workloads import parse_workload, workload_class

WORKLOADS = {
    "dense": ["dense:M=64,N=48,K=40", "dense:M=1,N=1000,K=512", "dense:M=13,N=7,K=11"],
    "batch_matmul": ["batch_matmul:B=3,M=16,N=32,K=8", "batch_matmul:B=2,M=7,N=5,K=3"],
    "conv2d": [
        "conv2d:N=1,C=8,H=10,W=10,K=32,R=3,S=3,pad=1",
        "conv2d:N=1,C=3,H=15,W=15,K=16,R=7,S=7,stride=2,pad=3",
        "conv2d:N=2,C=5,H=9,W=11,K=6,R=3,S=2,stride=2x1,pad=0x1x2x0,dilation=2x1",
        "conv2d:N=1,C=16,H=8,W=8,K=32,R=1,S=1,stride=2",
    ],
    "depthwise_conv2d": [
        "depthwise_conv2d:N=1,C=8,H=12,W=12,R=3,S=3,pad=1",
        "depthwise_conv2d:N=1,C=4,H=13,W=11,R=3,S=3,stride=2,pad=1",
        "depthwise_conv2d:N=2,C=3,H=7,W=9,R=3,S=2,stride=2x1,pad=0x1x1x0,multiplier=2",
        "depthwise_conv2d:N=1,C=5,H=9,W=9,R=3,S=3,stride=2",
    ],
}
#: operators listed above use those shapes; any other operator with an x86 template (a new one)
#: is picked up with the examples its workload class declares
SHAPES = {t.op: WORKLOADS.get(t.op) or list(workload_class(t.op).examples)
          for t in all_templates() if t.target_kind == "llvm"}
CASES = [(op, key) for op, keys in sorted(SHAPES.items()) for key in keys]


def run_config(key, index, threads=1):
    workload = parse_workload(key)
    template = get_template(workload.op)
    config = template.space(workload).get(index)
    try:
        artifact = build(workload, template, config, threads=threads)
    except UnsupportedHostError as e:  # VNNI / BF16 kernels on an older CPU
        pytest.skip(str(e))
    try:
        inputs = workload.make_inputs(7)
        prepared = artifact.prepare(inputs)
        prepared.run()
        reduction = workload.flops() / (2 * np.prod(workload.output_shape()))
        np.testing.assert_allclose(prepared.output, workload.reference(inputs), rtol=1e-4,
                                   atol=1e-5 * np.sqrt(reduction) + 1e-6)
    finally:
        artifact.close()


def test_every_operator_has_a_template():
    assert {t.op for t in all_templates()} >= set(WORKLOADS)


@pytest.mark.parametrize("op", sorted(SHAPES))
def test_every_template_has_shapes_to_test(op):
    assert SHAPES[op], f"{op}: list shapes here or declare examples on its workload class"
    assert all(parse_workload(key).op == op for key in SHAPES[op])


@pytest.mark.parametrize("op, key", CASES)
def test_default_config_matches_numpy(op, key):
    workload = parse_workload(key)
    run_config(key, get_template(op).default_config(workload).index)


@pytest.mark.parametrize("op, key", CASES)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_valid_configs_match_numpy(op, key, data):
    workload = parse_workload(key)
    space = get_template(op).space(workload)
    seed = data.draw(st.integers(0, 2**32 - 1))
    (index,) = space.sample(1, np.random.default_rng(seed))
    threads = data.draw(st.sampled_from([1, 2]))
    run_config(key, index, threads)


def test_filtered_config_is_a_typed_error():
    workload = parse_workload("dense:M=64,N=64,K=64")
    template = get_template("dense")
    space = template.space(workload)
    bad = next(i for i in range(space.size) if not space.is_valid(i))
    with pytest.raises(InvalidConfigError):
        build(workload, template, space.get(bad))
    other = get_template("dense").space(parse_workload("dense:M=32,N=64,K=64")).get(5)
    with pytest.raises((InvalidConfigError, InvalidWorkloadError)):
        build(workload, template, other)


def test_wrong_workload_for_template():
    with pytest.raises(InvalidWorkloadError):
        get_template("dense").space(parse_workload("batch_matmul:B=1,M=2,N=2,K=2"))
    with pytest.raises(InvalidWorkloadError):
        get_template("dense", "opencl")


def test_error_kind_numbering_matches_autotvm():
    assert [k.value for k in ErrorKind] == list(range(9))
