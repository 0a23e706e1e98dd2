"""Default configs: valid and deterministic for any shape, and the analytic rules they follow.

An untuned build runs every layer with its template's default, so a default that is not in the
space (or is filtered out) would break a model build; the rules (Winograd where it wins, small
tiles for strided windows) are what ``bench/defaults.py`` measured.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.runtime import build
from schedule_templates.templates.base import get_template
from schedule_templates.templates.choose import (
    ACC_REGISTERS,
    RegisterFile,
    block_split,
    host_registers,
    vregs,
)
from schedule_templates.templates.x86_gemm import register_tile
from schedule_templates.templates.x86_winograd import default_winograd
from schedule_templates.workloads import parse_workload

small = st.integers(1, 64)
window = st.tuples(st.integers(1, 7), st.integers(1, 7), st.integers(1, 3), st.integers(1, 3),
                   st.integers(0, 3), st.integers(1, 2))


def _window_params(draw_window: tuple[int, int, int, int, int, int]) -> str:
    r, s, sh, sw, pad, dilation = draw_window
    return f"R={r},S={s},stride={sh}x{sw},pad={pad},dilation={dilation}"


@st.composite
def workload_keys(draw: st.DrawFn) -> str:
    op = draw(st.sampled_from(["conv2d", "depthwise_conv2d", "group_conv2d", "dense",
                               "batch_matmul"]))
    if op == "dense":
        return f"dense:M={draw(st.integers(1, 300))},N={draw(st.integers(1, 3100))}," \
               f"K={draw(st.integers(1, 3100))}"
    if op == "batch_matmul":
        return f"batch_matmul:B={draw(st.integers(1, 16))},M={draw(st.integers(1, 200))}," \
               f"N={draw(st.integers(1, 200))},K={draw(st.integers(1, 200))}"
    n, h, w = draw(st.integers(1, 2)), draw(st.integers(1, 120)), draw(st.integers(1, 120))
    shape = f"N={n},H={h},W={w},{_window_params(draw(window))}"
    if op == "depthwise_conv2d":
        return f"{op}:C={draw(small)},{shape},multiplier={draw(st.integers(1, 2))}"
    if op == "conv2d":
        return f"{op}:C={draw(small)},K={draw(st.integers(1, 600))},{shape}"
    groups = draw(st.integers(2, 16))
    return f"{op}:C={groups * draw(small)},K={groups * draw(small)},{shape},groups={groups}"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(workload_keys())
def test_the_default_is_a_valid_config_of_the_space_for_any_shape(key):
    try:
        workload = parse_workload(key)
    except InvalidWorkloadError:
        assume(False)
        return
    template = get_template(workload.op)
    config = template.default_config(workload)
    template.check(workload, config)  # in the space and not filtered out
    assert template.default_config(workload) == config


@pytest.mark.parametrize(("key", "algorithm"), [
    ("conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1", "winograd4"),
    ("conv2d:N=1,C=128,H=28,W=28,K=128,R=3,S=3,pad=1", "winograd4"),
    ("conv2d:N=1,C=256,H=14,W=14,K=256,R=3,S=3,pad=1", "winograd2"),
    ("conv2d:N=1,C=512,H=7,W=7,K=512,R=3,S=3,pad=1", "direct"),  # too few tiles
    ("conv2d:N=1,C=3,H=224,W=224,K=64,R=3,S=3,pad=1", "direct"),  # too few channels
    ("conv2d:N=1,C=64,H=56,W=56,K=128,R=3,S=3,stride=2,pad=1", "direct"),
])
def test_conv2d_default_uses_winograd_where_it_wins(key, algorithm):
    workload = parse_workload(key)
    assert get_template("conv2d").default_config(workload)["algorithm"] == algorithm


def test_conv2d_default_keeps_strided_register_tiles_small():
    workload = parse_workload("conv2d:N=1,C=3,H=224,W=224,K=64,R=7,S=7,stride=2,pad=3")
    config = get_template("conv2d").default_config(workload)
    oht, owt, kt = config["tile_oh"][1], config["tile_ow"][1], config["tile_k"][1]
    assert oht * owt <= 8 and owt in (4, 8)
    assert oht * owt * vregs(kt) <= ACC_REGISTERS


@pytest.mark.parametrize("key", [
    "conv2d:N=1,C=16,H=24,W=24,K=32,R=3,S=3,pad=1,epilogue=bias+relu",  # Winograd F(4x4)
    "conv2d:N=1,C=16,H=14,W=14,K=16,R=3,S=3,pad=1",  # Winograd F(2x2), clipped tiles
    "conv2d:N=1,C=8,H=20,W=20,K=32,R=5,S=5,stride=2,pad=2",
])
def test_defaults_match_numpy(key):
    workload = parse_workload(key)
    template = get_template(workload.op)
    artifact = build(workload, template, template.default_config(workload))
    try:
        inputs = workload.make_inputs(3)
        prepared = artifact.prepare(inputs)
        prepared.run()
        np.testing.assert_allclose(prepared.output, workload.reference(inputs), rtol=1e-4,
                                   atol=1e-4)
    finally:
        artifact.close()


def test_gemm_default_fills_the_accumulators_and_blocks_the_reduction():
    assert register_tile(128, 768) == (8, 48)  # 24 accumulators, not 4 x 64's 16
    assert register_tile(197, 768) == (1, 64)  # why the template pads such an M first
    assert block_split(768, 4, 32 * 1024 // (4 * 48)) == (6, 32, 4)
    # a prime reduction stays one block: slivers would store and reload partial sums
    assert block_split(197, 1, 128) == (1, 197, 1)
    assert block_split(8, 4, 4096) == (1, 2, 4)


AVX2 = RegisterFile(lanes=8, accumulators=14)


def test_gemm_register_tile_fits_an_avx2_register_file():
    # 8 x 48 would be 48 ymm accumulators: spilled, ~3x slower than a fitting tile on Zen 3
    mr, nr = register_tile(128, 768, AVX2)
    assert (mr, nr) == (4, 24) and mr * AVX2.vregs(nr) <= AVX2.accumulators
    # equal work per step: the tile with fewer loads per step (2 + 4 vectors, not 1 + 8)
    assert register_tile(1024, 1024, AVX2) == (2, 32)
    # whole registers where N has such widths: 2 x 40, not 2 x 50 (six ymm and 2 lanes)
    assert register_tile(200, 200, AVX2) == (2, 40)
    assert register_tile(8, 1000) == (8, 40)  # no width of 1000 is 16 lanes whole: all compete


def test_winograd_default_fits_the_register_file_it_is_given():
    wl = parse_workload("conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1")
    for registers, lanes in ((AVX2, 8), (RegisterFile(16, ACC_REGISTERS), 16)):
        chosen = default_winograd(wl, registers)
        assert chosen is not None
        _, kt, rows = chosen
        assert rows * -(-kt // lanes) <= registers.accumulators


@pytest.mark.parametrize("key", ["dense:M=197,N=768,K=768", "dense:M=1,N=1000,K=512",
                                 "dense:M=128,N=768,K=768", "batch_matmul:B=12,M=197,N=197,K=64"])
def test_gemm_default_gives_two_threads_even_work(key):
    workload = parse_workload(key)
    config = get_template(workload.op).default_config(workload)
    batch = getattr(workload, "B", 1)
    assert batch * config["tile_m"][0] * config["tile_n"][0] >= 8
    assert config["tile_m"][2] * host_registers().vregs(config["tile_n"][2]) >= 4


@pytest.mark.parametrize(("key", "order"), [
    ("conv2d:N=1,C=256,H=56,W=56,K=64,R=1,S=1", "h_k"),  # narrowing, input outweighs weights
    ("conv2d:N=1,C=64,H=56,W=56,K=256,R=1,S=1", "k_h"),  # widening
    ("conv2d:N=1,C=1024,H=14,W=14,K=256,R=1,S=1", "k_h"),  # weights outweigh the input
])
def test_conv2d_default_loop_order_follows_the_larger_operand(key, order):
    assert get_template("conv2d").default_config(parse_workload(key))["outer_order"] == order


@pytest.mark.parametrize("key", [
    "conv2d:N=1,C=64,H=56,W=56,K=64,R=1,S=1",
    "conv2d:N=1,C=128,H=55,W=55,K=16,R=1,S=1",
    "conv2d:N=1,C=512,H=13,W=13,K=1000,R=1,S=1",
    "conv2d:N=1,C=3,H=224,W=224,K=64,R=3,S=3,stride=2",
])
def test_conv2d_default_tile_fits_the_host_registers(key):
    """16 ymm registers hold a quarter of what 32 zmm do: an AVX-512-sized tile spills."""
    registers = host_registers()
    config = get_template("conv2d").default_config(parse_workload(key))
    pixels = config["tile_oh"][1] * config["tile_ow"][1]
    assert pixels * registers.vregs(config["tile_k"][1]) <= registers.accumulators
    assert pixels >= 4
