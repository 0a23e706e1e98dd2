"""int8 of narrow weights (``weights=narrow``: every weight within +-64) on hosts without VNNI:
``vpmaddubsw`` + ``vpmaddwd`` by ones, exact for such weights; its pixel rows of 5 x 16; and the
refusal of wider weights. On a VNNI host the ``instruction`` fixture's AVX2 mode gives narrow
keys vpmaddubsw, so these run wherever x86 does."""

import numpy as np
import pytest

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.runtime import build
from schedule_templates.templates import x86_dot_gemm
from schedule_templates.templates.base import get_template
from schedule_templates.templates.x86_int8_phases import Geometry
from schedule_templates.workloads import parse_workload
from tests.schedule_templates.test_core_int8 import _intrinsic_lanes, run


def test_pmaddubsw_is_exact_at_the_extremes_of_narrow_weights():
    """u8 255 times weights of +-64: the largest pair sums (+-32640) fit int16 unsaturated."""
    lanes = 16
    rng = np.random.default_rng(0)
    data = rng.choice([0, 1, 254, 255], size=(lanes, 4)).astype(np.uint8)
    data[0] = 255
    weight = rng.choice([-64, -63, 63, 64, 0], size=(lanes, 4)).astype(np.int8)
    weight[0], weight[1] = 64, -64
    start = rng.integers(-2**30, 2**30, size=lanes).astype(np.int32)
    got = _intrinsic_lanes("pmaddubsw", start, data.view(np.int32).reshape(-1),
                           weight.view(np.int32).reshape(-1))
    expected = start.astype(np.int64) + (data.astype(np.int64) * weight).sum(axis=1)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("key", [
    "dense_int8:M=5,N=33,K=13,out=s8,weights=narrow",  # bytes in place only for whole words
    "dense_int8:M=6,N=64,K=64,bias=s32,weights=narrow",
    "conv2d_int8:N=1,C=6,H=9,W=8,K=16,R=3,S=3,stride=2,pad=1,weights=narrow",
    "conv2d_int8:N=1,C=16,H=7,W=7,K=32,R=1,S=1,bias=s32,weights=narrow,residual=u8",
])
def test_narrow_weights_are_exact_on_every_instruction(instruction, key):
    out, ref, _ = run(key)
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("key", [
    "conv2d_int8:N=1,C=128,H=7,W=7,K=32,R=3,S=3,pad=1,bias=s32,weights=narrow",
    "conv2d_int8:N=1,C=64,H=14,W=14,K=48,R=3,S=3,stride=2,pad=1,weights=narrow,residual=s8",
    # onnxruntime's saturating pairs (test_core_int8_sat16): vpmaddubsw on every host
    "conv2d_int8:N=1,C=128,H=7,W=7,K=32,R=3,S=3,pad=1,bias=s32,weights=sat16",
])
def test_narrow_pixel_rows_of_five_are_exact(instruction, key):
    """AVX2's vpmaddubsw takes 7x7 maps as pixel rows of 5 x 16 (its 5 accumulators): the
    default there, and exact (or sat16's own sums) on every host's instruction."""
    workload = parse_workload(key)
    template = get_template(workload.op)
    if x86_dot_gemm.workload_instruction(workload) is x86_dot_gemm.PMADDUBSW:
        assert template.default_config(workload)["pk_tile"] == "5x16"
    entities = {name: value for name, _, value in template.default_config(workload).entities}
    columns = Geometry(workload, x86_dot_gemm.VNNI).columns
    entities.update(pk_tile="5x16", tile_m=(workload.K, 1, 1), tile_n=(columns // 16, 1, 16))
    out, ref, _ = run(key, entities=entities)
    np.testing.assert_array_equal(out, ref)


def test_narrow_hot_loop_without_vnni_is_vpmaddubsw(monkeypatch):
    monkeypatch.setattr(x86_dot_gemm, "int8_instruction", lambda narrow=False: (
        x86_dot_gemm.PMADDUBSW if narrow else x86_dot_gemm.PMADDWD))
    _, _, asm = run("dense_int8:M=8,N=64,K=64,weights=narrow")
    assert asm.count("vpmaddubsw") >= 8 and "vpmulld" not in asm
    _, _, wide = run("dense_int8:M=8,N=64,K=64")
    assert "vpmaddubsw" not in wide


@pytest.mark.parametrize("key", ["dense_int8:M=4,N=16,K=8,weights=narrow",
                                 "conv2d_int8:N=1,C=4,H=5,W=5,K=16,R=3,S=3,weights=narrow"])
def test_narrow_key_refuses_wider_weights(key):
    """A kernel for narrow weights would saturate on wider ones: refused when packed."""
    workload = parse_workload(key)
    template = get_template(workload.op)
    artifact = build(workload, template, template.default_config(workload))
    inputs = workload.make_inputs(1)
    inputs["weight"] = inputs["weight"].copy()
    inputs["weight"].reshape(-1)[3] = 65
    try:
        with pytest.raises(InvalidWorkloadError, match="weights=narrow"):
            artifact.prepare(inputs)
        inputs["weight"].reshape(-1)[3] = -64  # the bound itself is narrow
        artifact.prepare(inputs).close()
    finally:
        artifact.close()
