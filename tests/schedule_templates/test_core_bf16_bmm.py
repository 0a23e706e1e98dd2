"""``batch_matmul_bf16``: both operands rounded and packed in the kernel (M rounded up, columns
past N and the value past an odd K zero), the batches split between threads. Kernels skip
(with the reason) on CPUs without AVX-512 BF16."""

import numpy as np
import pytest

from schedule_templates.templates.base import get_template
from schedule_templates.workloads import parse_workload
from schedule_templates.workloads.lowp import from_bfloat16, to_bfloat16
from tests.schedule_templates.test_core_lowp import needs_bf16, run


def test_reference_rounds_both_operands():
    workload = parse_workload("batch_matmul_bf16:B=2,M=5,N=7,K=9")
    inputs = workload.make_inputs(0)
    x = from_bfloat16(to_bfloat16(inputs["x"])).astype(np.float64)
    y = from_bfloat16(to_bfloat16(inputs["y"])).astype(np.float64)
    np.testing.assert_allclose(workload.reference(inputs), x @ y, rtol=1e-6, atol=1e-6)
    assert np.abs(workload.reference(inputs) - inputs["x"] @ inputs["y"]).max() > 1e-4


@needs_bf16
@pytest.mark.parametrize("key", [
    "batch_matmul_bf16:B=3,M=8,N=32,K=16",
    "batch_matmul_bf16:B=2,M=19,N=21,K=7",     # M rounded up, N padded, K odd
    "batch_matmul_bf16:B=12,M=37,N=197,K=64",  # ViT's columns: the last panel guarded
    "batch_matmul_bf16:B=1,M=6,N=48,K=65",     # one batch: the nest's own parallel loop
])
@pytest.mark.parametrize("threads", [1, 2])
def test_default_config_matches_the_rounded_reference(key, threads):
    out, ref, asm = run(key, threads=threads)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    assert "vdpbf16ps" in asm


@needs_bf16
@pytest.mark.parametrize("entities", [
    {"tile_m": (2, 2, 4), "tile_n": (1, 1, 48), "tile_k": (1, 4, 2), "outer_order": "mn",
     "inner_order": "nm", "parallel": "n"},
    {"tile_m": (1, 4, 4), "tile_n": (3, 1, 16), "tile_k": (1, 8, 1), "outer_order": "nm",
     "inner_order": "mn", "parallel": "m"},
])
def test_other_tilings_match(entities):
    out, ref, _ = run("batch_matmul_bf16:B=4,M=16,N=40,K=15", entities=entities, threads=2)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_space_keeps_one_k_block():
    workload = parse_workload("batch_matmul_bf16:B=12,M=128,N=128,K=64")
    space = get_template("batch_matmul_bf16").space(workload)
    valid = [space.get(i) for i in range(0, space.size, max(1, space.size // 400))
             if space.is_valid(i)]
    assert valid and all(cfg["tile_k"][0] == 1 for cfg in valid)
