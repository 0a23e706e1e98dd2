"""Smooth activations in fused epilogues: keys, the numpy reference, every fusing x86 template
(and the Winograd lowering) against it, and the CUDA templates' sources with nvcc."""

import math
import shutil
import subprocess

import numpy as np
import pytest

from schedule_templates.codegen.cuda_c import generate_cuda
from schedule_templates.errors import InvalidWorkloadError, UnsupportedHostError
from schedule_templates.runtime import build, lower
from schedule_templates.templates.base import all_templates, get_template
from schedule_templates.workloads import parse_workload, workload_class
from schedule_templates.workloads.epilogue import (
    ACTIVATIONS,
    Activation,
    Epilogue,
    parse_epilogue,
)

BASES = {
    "conv2d": "conv2d:N=1,C=5,H=9,W=11,K=20,R=3,S=3,pad=1",
    "depthwise_conv2d": "depthwise_conv2d:N=1,C=8,H=9,W=10,R=3,S=3,stride=2,pad=1",
    "dense": "dense:M=13,N=40,K=24",
}
BASES.update({t.op: workload_class(t.op).examples[0] for t in all_templates()
              if t.fuses_epilogue and t.op not in BASES})
ACTS = ["sigmoid", "silu", "hardswish", "hardsigmoid", "hardsigmoid(0.16666667:0.5)", "tanh",
        "gelu"]
CUDA = "cuda -arch=sm_90"


def fused(base: str, epilogue: str):
    return parse_workload(f"{base},epilogue={epilogue}")


def check(workload, config, threads=1):
    template = get_template(workload.op)
    try:
        artifact = build(workload, template, config, threads=threads)
    except UnsupportedHostError as e:  # bf16 kernels on a CPU without AVX-512 BF16
        pytest.skip(str(e))
    try:
        inputs = workload.make_inputs(4)
        prepared = artifact.prepare(inputs)
        prepared.run()
        reduction = workload.flops() / (2 * np.prod(workload.output_shape()))
        np.testing.assert_allclose(prepared.output, workload.reference(inputs), rtol=1e-4,
                                   atol=1e-5 * np.sqrt(reduction) + 1e-6,
                                   err_msg=f"{workload.key} config {config.index}")
    finally:
        artifact.close()


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("op", sorted(op for op, t in ((t.op, t) for t in all_templates())
                                      if t.fuses_epilogue and t.target_kind == "llvm"))
def test_every_x86_template_fuses_every_activation(op, act):
    for epilogue in (act, f"scale+bias+residual+{act}"):
        workload = fused(BASES[op], epilogue)
        check(workload, get_template(op).default_config(workload))


@pytest.mark.parametrize("act", ["silu", "gelu", "hardswish"])
def test_random_configs_and_threads(act):
    for op in ("conv2d", "dense", "depthwise_conv2d"):
        workload = fused(BASES[op], f"bias+{act}")
        space = get_template(op).space(workload)
        for index in space.sample(2, np.random.default_rng(len(act))):
            check(workload, space.get(index), threads=2)


@pytest.mark.parametrize("algorithm", ["winograd2", "winograd4"])
def test_winograd_lowering_fuses_activations(algorithm):
    workload = fused("conv2d:N=1,C=8,H=8,W=8,K=16,R=3,S=3,pad=1", "bias+silu")
    space = get_template("conv2d").space(workload)
    rng = np.random.default_rng(1)
    for _ in range(50):
        picked = [space.get(i) for i in space.sample(64, rng)]
        found = [c for c in picked if dict((n, v) for n, _, v in c.entities)["algorithm"]
                 == algorithm]
        if found:
            for act in ("silu", "gelu", "tanh"):
                check(fused("conv2d:N=1,C=8,H=8,W=8,K=16,R=3,S=3,pad=1", f"bias+{act}"),
                      found[0])
            return
    pytest.fail(f"no {algorithm} config sampled")


@pytest.mark.parametrize("text, canonical", [
    ("gelu", "gelu"),
    ("relu6", "relu6"),
    ("silu+bias", "bias+silu"),
    ("hardsigmoid", "hardsigmoid(0.2:0.5)"),
    ("hardsigmoid(0.2:0.5)", "hardsigmoid(0.2:0.5)"),
    ("hardsigmoid(0.1666666667:.5)", "hardsigmoid(0.16666667:0.5)"),
    ("residual scale tanh", "scale+residual+tanh"),
])
def test_activation_keys_are_canonical_and_round_trip(text, canonical):
    epilogue = parse_epilogue(text)
    assert epilogue.text == canonical
    assert parse_epilogue(epilogue.text) == epilogue
    workload = fused("dense:M=2,N=3,K=4", text)
    assert workload.key.endswith(f",epilogue={canonical}")
    assert parse_workload(workload.key) == workload
    assert workload.base_key == "dense:M=2,N=3,K=4"


def test_old_keys_are_unchanged():
    for text in ("relu", "bias+relu6", "scale+bias+residual+clip(-1:1.5)"):
        assert parse_epilogue(text).activation is None
        assert parse_epilogue(text).text == text


@pytest.mark.parametrize("text, message", [
    ("relu+gelu", "more than one activation"),
    ("sigmoid+tanh", "more than one activation"),
    ("sigmoid(1:2)", "takes 0 parameter"),
    ("hardsigmoid(0.2)", "takes 2 parameter"),
    ("hardsigmoid(a:b)", "not numbers"),
    ("hardsigmoid(0.2:0.5", "no closing bracket"),
    ("hardsigmoid(inf:0.5)", "must be finite"),
    ("swish", "unknown part 'swish'"),
])
def test_bad_activations_give_clear_errors(text, message):
    with pytest.raises(InvalidWorkloadError, match=message):
        parse_epilogue(text)
    with pytest.raises(InvalidWorkloadError, match=message):
        parse_workload(f"dense:M=1,N=2,K=3,epilogue={text}")


def test_clip_and_activation_together_are_refused():
    with pytest.raises(InvalidWorkloadError, match="more than one activation"):
        Epilogue(clip=(0.0, 6.0), activation=Activation("gelu"))


def test_reference_formulas():
    x = np.linspace(-12, 12, 97, dtype=np.float32)
    sig = 1 / (1 + np.exp(-x.astype(np.float64)))
    erf = np.array([math.erf(v / math.sqrt(2)) for v in x.astype(np.float64)])
    want = {
        "sigmoid": sig, "silu": x * sig, "tanh": np.tanh(x.astype(np.float64)),
        "hardswish": x * np.clip(x / 6 + 0.5, 0, 1), "hardsigmoid": np.clip(0.2 * x + 0.5, 0, 1),
        "gelu": 0.5 * x * (1 + erf),
    }
    assert set(want) == set(ACTIVATIONS)
    for name, expected in want.items():
        got = Epilogue(activation=Activation(name)).apply(x, {})
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7, err_msg=name)


def test_described():
    workload = fused("dense:M=2,N=3,K=4", "bias+hardsigmoid(0.16666667:0.5)")
    assert workload.describe().endswith("fused bias + hardsigmoid(0.16666667:0.5)")


def _cuda_sources() -> list[tuple[str, str]]:
    out = []
    for template in all_templates():
        if template.target_kind != "cuda" or not template.fuses_epilogue:
            continue
        for act in ("silu", "gelu", "tanh", "hardsigmoid", "hardswish", "sigmoid"):
            workload = fused(BASES[template.op], f"bias+{act}")
            cuda_template = get_template(template.op, CUDA)
            config = cuda_template.default_config(workload)
            kernel = lower(workload, cuda_template, config)
            name = f"k{len(out)}"
            out.append((f"{workload.key}", generate_cuda(kernel, name=name).source))
    return out


def test_cuda_templates_emit_activations():
    sources = _cuda_sources()
    assert sources
    text = "\n".join(src for _, src in sources)
    assert "erff(" in text and "tanhf(" in text and "expf(" in text


def test_cuda_templates_with_activations_compile(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed: generated CUDA C cannot be compile-checked")
    src = tmp_path / "acts.cu"
    src.write_text("".join(f"// ---- {label}\n{text}\n" for label, text in _cuda_sources()))
    result = subprocess.run([nvcc, "-cubin", "-arch=sm_90", "-o", str(tmp_path / "acts.cubin"),
                             str(src)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
