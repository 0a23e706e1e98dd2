"""Fused epilogues: keys, the shared search space, and every fusing template against numpy."""

import numpy as np
import pytest

from schedule_templates.errors import InvalidConfigError, InvalidWorkloadError, UnsupportedHostError
from schedule_templates.runtime import build
from schedule_templates.templates.base import all_templates, get_template
from schedule_templates.templates.x86_gemm import DenseX86
from schedule_templates.workloads import parse_workload, workload_class
from schedule_templates.workloads.epilogue import NO_EPILOGUE, Epilogue, parse_epilogue

BASES = {
    "conv2d": [
        "conv2d:N=1,C=8,H=10,W=10,K=32,R=3,S=3,pad=1",
        "conv2d:N=2,C=5,H=9,W=11,K=6,R=3,S=2,stride=2x1,pad=0x1x2x0",
    ],
    "depthwise_conv2d": [
        "depthwise_conv2d:N=1,C=8,H=12,W=12,R=3,S=3,pad=1",
        "depthwise_conv2d:N=1,C=3,H=13,W=11,R=3,S=3,stride=2,pad=1,multiplier=2",
    ],
    "dense": ["dense:M=13,N=48,K=40", "dense:M=1,N=32,K=64"],
}
# any other fusing x86 template (a new one) is tested on the first examples of its workload
BASES.update({t.op: list(workload_class(t.op).examples[:2]) for t in all_templates()
              if t.fuses_epilogue and t.target_kind == "llvm" and t.op not in BASES})
EPILOGUES = [
    "bias", "scale", "scale+bias", "residual", "relu", "relu6", "clip(-0.25:0.5)",
    "clip(-inf:0.1)", "bias+relu", "scale+bias+relu6", "bias+residual+relu",
    "scale+bias+residual+clip(-1:1.5)",
]
#: every epilogue on one shape per operator (default config) ...
MATRIX = [(keys[0], ep) for keys in BASES.values() for ep in EPILOGUES]
#: ... and the full epilogues on every shape with several configs
SEARCHED = [(base, ep) for keys in BASES.values() for base in keys
            for ep in ("scale+bias+residual+relu", "bias+clip(-0.25:0.5)")]


def fused(base: str, epilogue: str):
    return parse_workload(f"{base},epilogue={epilogue}")


def check(workload, index, threads=1):
    template = get_template(workload.op)
    try:
        artifact = build(workload, template, template.space(workload).get(index), threads=threads)
    except UnsupportedHostError as e:  # bf16 kernels on a CPU without AVX-512 BF16
        pytest.skip(str(e))
    try:
        inputs = workload.make_inputs(11)
        prepared = artifact.prepare(inputs)
        prepared.run()
        reduction = workload.flops() / (2 * np.prod(workload.output_shape()))
        np.testing.assert_allclose(prepared.output, workload.reference(inputs), rtol=1e-4,
                                   atol=1e-5 * np.sqrt(reduction) + 1e-6)
    finally:
        artifact.close()


def configs(workload, count=2):
    """The default config plus ``count`` random valid ones (fixed seed per key)."""
    template = get_template(workload.op)
    space = template.space(workload)
    seed = sum(map(ord, workload.key))
    picked = [template.default_config(workload).index]
    picked += space.sample(count, np.random.default_rng(seed))
    if workload.op == "dense":
        # a split reduction stores partial sums first: the epilogue must wait for the last one
        picked.append(next(i for i in range(space.size)
                           if space.is_valid(i) and space.get(i)["tile_k"][0] > 1))
    return picked


@pytest.mark.parametrize("base, epilogue", MATRIX)
def test_every_epilogue_matches_numpy(base, epilogue):
    workload = fused(base, epilogue)
    check(workload, get_template(workload.op).default_config(workload).index)


@pytest.mark.parametrize("base, epilogue", SEARCHED)
def test_fused_configs_match_numpy(base, epilogue):
    workload = fused(base, epilogue)
    for index in configs(workload)[1:]:
        check(workload, index)


@pytest.mark.parametrize("op", sorted(BASES))
def test_fused_kernel_with_two_threads(op):
    workload = fused(BASES[op][0], "scale+bias+residual+relu")
    check(workload, configs(workload, count=1)[-1], threads=2)


def test_reference_applies_the_epilogue_in_order():
    workload = fused("dense:M=3,N=4,K=5", "scale+bias+residual+clip(-0.5:0.25)")
    inputs = workload.make_inputs(2)
    plain = inputs["data"] @ inputs["weight"].T
    expected = np.clip(plain * inputs["scale"] + inputs["bias"] + inputs["residual"], -0.5, 0.25)
    np.testing.assert_allclose(workload.reference(inputs), expected, rtol=1e-6, atol=1e-6)
    assert set(workload.input_shapes()) == {"data", "weight", "scale", "bias", "residual"}
    assert workload.input_shapes()["residual"] == workload.output_shape()
    assert workload.input_shapes()["scale"] == (4,)


@pytest.mark.parametrize("op", sorted(BASES))
def test_fused_workload_keeps_the_base_space_and_flops(op):
    base = parse_workload(BASES[op][0])
    workload = fused(BASES[op][0], "scale+bias+residual+relu6")
    template = get_template(op)
    space, base_space = template.space(workload), template.space(base)
    assert space.size == base_space.size
    for index in np.random.default_rng(0).integers(0, space.size, 20):
        assert space.get(int(index)).entities == base_space.get(int(index)).entities
        assert space.is_valid(int(index)) == base_space.is_valid(int(index))
    assert template.default_config(workload).index == template.default_config(base).index
    assert workload.flops() == base.flops()
    assert workload.base_workload() == base and workload.base_key == base.key
    assert base.base_workload() is base and base.epilogue_spec == NO_EPILOGUE
    # a config found for the base builds for the fused workload, and vice versa
    template.check(workload, base_space.get(template.default_config(base).index))


@pytest.mark.parametrize("op", sorted(BASES))
def test_plain_kernels_take_no_epilogue_arguments(op):
    workload = parse_workload(BASES[op][0])
    template = get_template(op)
    kernel = template.lower(workload, template.default_config(workload))
    plain = [b.name for b in kernel.params]
    # data and weights (and, for some templates, constants of their own such as tap offsets)
    assert plain[-1] == "out" and not {"scale", "bias", "residual"} & set(plain)
    fused_kernel = template.lower(fused(BASES[op][0], "scale+bias+residual+relu"),
                                  template.default_config(workload))
    assert [b.name for b in fused_kernel.params] == [*plain[:-1], "scale", "bias", "residual",
                                                     "out"]


def test_keys_without_epilogue_are_unchanged():
    key = "conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1"
    assert parse_workload(key).key == key
    assert parse_workload(f"{key},epilogue=none").key == key
    assert parse_workload(f"{key},epilogue=").key == key


@pytest.mark.parametrize("text, canonical", [
    ("relu+bias", "bias+relu"),
    ("residual bias scale", "scale+bias+residual"),
    ("clip(0:6)", "relu6"),
    ("clip(0:inf)", "relu"),
    ("clip(-0:inf)", "relu"),
    ("clip(-inf:inf)", ""),
    ("bias+clip(-1e-3:3e38)", "bias+clip(-0.001:3e38)"),
    ("clip(-1e-7:1e6)", "clip(-1e-7:1e6)"),
    ("clip(0.1:0.2)", "clip(0.1:0.2)"),
])
def test_epilogue_text_is_canonical_and_round_trips(text, canonical):
    epilogue = parse_epilogue(text)
    assert epilogue.text == canonical
    assert parse_epilogue(epilogue.text) == epilogue
    key = fused("dense:M=2,N=3,K=4", text).key
    assert parse_workload(key) == fused("dense:M=2,N=3,K=4", text)
    assert key.endswith(f",epilogue={canonical}") or (not canonical and "epilogue" not in key)


@pytest.mark.parametrize("key, message", [
    ("dense:M=1,N=2,K=3,epilogue=swish", "unknown part 'swish'"),
    ("dense:M=1,N=2,K=3,epilogue=relu+relu6", "more than one activation"),
    ("dense:M=1,N=2,K=3,epilogue=bias+bias", "given twice"),
    ("dense:M=1,N=2,K=3,epilogue=clip(2:1)", "not low <= high"),
    ("dense:M=1,N=2,K=3,epilogue=clip(nan:1)", "not low <= high"),
    ("dense:M=1,N=2,K=3,epilogue=clip(1)", "clip\\(LOW:HIGH\\)"),
    ("batch_matmul:B=1,M=2,N=3,K=4,epilogue=relu", "unknown parameter 'epilogue'"),
])
def test_bad_epilogues_give_clear_errors(key, message):
    with pytest.raises(InvalidWorkloadError, match=message):
        parse_workload(key)


def test_epilogue_is_described_and_serialized():
    workload = fused("depthwise_conv2d:N=1,C=8,H=12,W=12,R=3,S=3,pad=1", "bias+relu6")
    assert workload.describe().endswith("fused bias + relu6")
    assert workload.to_dict()["epilogue"] == "bias+relu6"
    assert Epilogue(bias=True, clip=(0.0, 6.0)) == workload.epilogue_spec


def test_template_that_cannot_fuse_refuses_a_fused_workload():
    class PlainDense(DenseX86):
        name = "dense.plain"
        fuses_epilogue = False

    workload = fused("dense:M=4,N=16,K=8", "relu")
    template = PlainDense()
    with pytest.raises(InvalidWorkloadError, match="cannot fuse"):
        template.check(workload, template.default_config(workload))
    template.check(workload.base_workload(), template.default_config(workload))


def test_missing_epilogue_input_is_a_typed_error():
    workload = fused("dense:M=4,N=16,K=8", "bias")
    template = get_template("dense")
    artifact = build(workload, template, template.default_config(workload))
    try:
        inputs = workload.make_inputs(0)
        del inputs["bias"]
        with pytest.raises(InvalidConfigError, match="bias"):
            artifact.prepare(inputs)
    finally:
        artifact.close()


def test_every_fusing_template_is_covered():
    fusing = {t.op for t in all_templates() if t.fuses_epilogue and t.target_kind == "llvm"}
    assert fusing == set(BASES)
    assert all(BASES.values()), "declare examples on the workload class of every fusing operator"


@pytest.mark.parametrize("epilogue", ["bias+gelu", "scale+bias+residual+silu",
                                      "scale+sigmoid", "bias+tanh"])
@pytest.mark.parametrize("base", BASES["dense"])
def test_dense_applies_a_math_activation_in_a_pass_of_its_own(base, epilogue):
    """A math-call activation runs over the stored tile row by row after the linear part (also
    when the reduction is split, and on padded rows that are never stored)."""
    workload = fused(base, epilogue)
    template = get_template("dense")
    kernel = template.lower(workload, template.default_config(workload))
    assert "r_a" in repr(kernel)  # the separate row loop of the activation
    for index in configs(workload, count=2):
        check(workload, index)
    check(workload, configs(workload, count=1)[-1], threads=2)
