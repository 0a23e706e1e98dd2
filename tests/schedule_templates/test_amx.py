"""AMX tile statements and the int8 dense kernel on tiles.

Code generation is checked everywhere (compiled for a Sapphire Rapids CPU, the instructions
counted); running needs a host whose CPU and kernel grant the tile registers, and each such test
says so when it skips. The dense kernel's exactness on odd shapes runs through
``test_core_int8`` (its ``instruction`` fixture takes the tiles on such a host)."""

from __future__ import annotations

import llvmlite.binding as llvm
import numpy as np
import pytest

from schedule_templates.codegen.llvm_ir import generate_llvm_ir
from schedule_templates.codegen.llvm_jit import CompiledKernel, _initialize, optimize
from schedule_templates.features import FeatureExtractor
from schedule_templates.ir.amx import TileMatmul
from schedule_templates.ir.nodes import (
    Allocate,
    Buffer,
    Kernel,
    LoopKind,
    Scope,
    Var,
    loop,
    store,
)
from schedule_templates.ir.printer import format_kernel
from schedule_templates.runtime import build, host_module, lower
from schedule_templates.templates import x86_amx_gemm, x86_dot_gemm
from schedule_templates.templates.base import get_template
from schedule_templates.workloads import parse_workload

HAS_AMX = x86_amx_gemm.host_amx("tdpbusd")
needs_amx = pytest.mark.skipif(not HAS_AMX, reason="this host (CPU or kernel) grants no AMX "
                                                    "tile registers")


def _sapphire_rapids_asm(kernel: Kernel) -> str:
    _initialize()
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu="sapphirerapids", features="+amx-tile,+amx-int8,+amx-bf16,+avx512vnni", opt=3)
    return str(machine.emit_assembly(optimize(str(generate_llvm_ir(kernel)), machine)))


def _block_kernel(rows: int, cols: int, words: int, expand: bool) -> Kernel:
    """acc = one TileMatmul at an offset into a and b (panels of 16 columns), copied out."""
    a = Buffer("a", (TILE_M := 16 * rows + 16, words + 16), dtype="int32")
    b = Buffer("b", (cols + 1, words + 16, 16), dtype="int32")
    out = Buffer("out", (16 * rows, 16 * cols), dtype="int32")
    acc = Buffer("acc", out.shape, Scope.LOCAL, "int32")
    k = Var("k")
    tile = TileMatmul("tdpbusd", acc, k, words // 16, a[TILE_M - 16 * rows, 16 + 16 * k],
                      a.shape[1], 16 * a.shape[1], b[1, 16 + 16 * k, 0], 16, b.shape[1] * 16,
                      rows, cols)
    r, over_r = loop("r", out.shape[0])
    j, over_j = loop("j", out.shape[1], LoopKind.VECTORIZE)
    body = Allocate(acc, (tile.expand() if expand else tile, over_r(over_j(store(out[r, j],
                                                                                 acc[r, j])))))
    return Kernel("tile_block", (a, b, out), (), (body,))


@needs_amx
@pytest.mark.parametrize(("rows", "cols", "words"), [(2, 2, 32), (1, 3, 16), (3, 1, 48)])
def test_tile_matmul_is_its_expansion_and_numpy(rows, cols, words):
    rng = np.random.default_rng(rows * 10 + cols)
    a_buf, b_buf, out_buf = _block_kernel(rows, cols, words, False).params
    a = rng.integers(0, 256, (a_buf.shape[0], 4 * a_buf.shape[1]), dtype=np.uint8)
    b = rng.integers(-128, 128, (*b_buf.shape, 4), dtype=np.int8)
    results = []
    for expand in (False, True):
        kernel = _block_kernel(rows, cols, words, expand)
        out = np.zeros(out_buf.shape, np.int32)
        compiled = CompiledKernel(host_module(kernel), kernel.name, 3)
        compiled.function(a.ctypes.data, b.ctypes.data, out.ctypes.data, 1)
        compiled.close()
        results.append(out)
    first = a_buf.shape[0] - 16 * rows
    rows_a = a[first:, 64:64 + 4 * words].astype(np.int64).reshape(16 * rows, words, 4)
    panels = b[1:1 + cols, 16:16 + words].astype(np.int64)  # (cols, words, 16, 4)
    want = np.einsum("rwq,pwjq->rpj", rows_a, panels).reshape(16 * rows, 16 * cols)
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], want)


def test_tile_matmul_refuses_more_tiles_than_registers():
    acc = Buffer("acc", (16, 64), Scope.LOCAL, "int32")
    a, b = Buffer("a", (16, 16), dtype="int32"), Buffer("b", (4, 16, 16), dtype="int32")
    k = Var("k")
    with pytest.raises(ValueError, match="tile registers"):
        TileMatmul("tdpbusd", acc, k, 1, a[0, 0], 16, 256, b[0, 0, 0], 16, 256, 1, 4)
    with pytest.raises(ValueError, match="accumulates in float32"):
        TileMatmul("tdpbf16ps", Buffer("acc", (16, 16), Scope.LOCAL, "int32"), k, 1,
                   a[0, 0], 16, 256, b[0, 0, 0], 16, 256, 1, 1)


@pytest.mark.parametrize(("key", "dot"), [
    ("dense_int8:M=128,N=768,K=768,bias=s32", "tdpbusd"),
    ("dense_int8:M=1,N=1000,K=2048,bias=s32", "tdpbusd"),
    ("dense_int8:M=37,N=40,K=100,out=s8,add=u8", "tdpbusd"),
    ("conv2d_int8:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1,bias=s32", "tdpbsud"),
    ("conv2d_int8:N=1,C=256,H=14,W=14,K=1024,R=1,S=1,bias=s32,residual=u8", "tdpbsud"),
    ("conv2d_int8:N=1,C=3,H=224,W=224,K=64,R=7,S=7,stride=2,pad=3,bias=s32", "tdpbsud"),
    ("conv2d_int8:N=1,C=32,H=16,W=16,K=64,R=1,S=1,bias=s32,residual=u8", "tdpbsud"),
])
def test_int8_on_tiles_compiles_for_sapphire_rapids(monkeypatch, key, dot):
    """Wherever the tests run: the tile kernel (padding stages included) becomes tile loads and
    tile dot products, the palette loaded once per thread's call and the tiles released
    after."""
    monkeypatch.setattr(x86_dot_gemm, "int8_instruction", lambda narrow=False: x86_dot_gemm.VNNI)
    monkeypatch.setattr(x86_amx_gemm, "host_amx", lambda dot="tdpbusd": True)
    workload = parse_workload(key)
    template = get_template(workload.op)
    kernel = lower(workload, template, template.default_config(workload))
    asm = _sapphire_rapids_asm(kernel)
    assert asm.count(dot) >= 2 and asm.count("tileloadd") >= 3
    assert asm.count("ldtilecfg") >= 1 and asm.count("tilerelease") >= 1
    assert "vpdpbusd" not in asm  # no vector dot products left beside the tiles


@pytest.mark.parametrize(("key", "hints"), [
    ("conv2d_int8:N=1,C=64,H=56,W=56,K=256,R=1,S=1,bias=s32,residual=u8", True),  # in place
    ("conv2d_int8:N=1,C=64,H=56,W=56,K=256,R=1,S=1,bias=s32", False),
    ("conv2d_int8:N=1,C=256,H=14,W=14,K=1024,R=1,S=1,bias=s32,residual=u8", False),  # copied
])
def test_tiles_hint_the_shortcut_they_add_in_place(monkeypatch, key, hints):
    """Stored in place, a register block reads the shortcut in 32 rows a map apart, so each
    row hints its next line (prefetcht1); the copy of phase-width rows reads it in order."""
    monkeypatch.setattr(x86_dot_gemm, "int8_instruction", lambda narrow=False: x86_dot_gemm.VNNI)
    monkeypatch.setattr(x86_amx_gemm, "host_amx", lambda dot="tdpbusd": True)
    workload = parse_workload(key)
    template = get_template(workload.op)
    asm = _sapphire_rapids_asm(lower(workload, template, template.default_config(workload)))
    assert ("prefetcht1" in asm) is hints


def test_conv_int8_takes_tiles_for_whole_steps_or_expanded_planes(monkeypatch):
    """A step of the tiles is 64 input channels of one tap; a single group of fewer channels
    (a stem) takes expanded planes, one per reduction word, if it has half a step of words;
    grouped layers of fewer channels, groups of a non-multiple of 64 and depthwise layers keep
    the vector kernels."""
    from schedule_templates.templates.x86_conv2d_int8 import (
        ExpandedGeometry,
        TileGeometry,
        _geometry,
    )

    monkeypatch.setattr(x86_dot_gemm, "int8_instruction", lambda narrow=False: x86_dot_gemm.VNNI)
    monkeypatch.setattr(x86_amx_gemm, "host_amx", lambda dot="tdpbusd": True)
    kinds = {}
    for key in ("conv2d_int8:N=1,C=64,H=8,W=8,K=64,R=3,S=3,pad=1",
                "conv2d_int8:N=1,C=3,H=16,W=16,K=64,R=7,S=7,stride=2,pad=3",
                "conv2d_int8:N=1,C=32,H=8,W=8,K=16,R=1,S=1",
                "conv2d_int8:N=1,C=16,H=8,W=8,K=16,R=1,S=1",
                "conv2d_int8:N=1,C=96,H=8,W=8,K=16,R=3,S=3,pad=1",
                "conv2d_int8:N=1,C=128,H=8,W=8,K=128,R=3,S=3,pad=1,groups=4",
                "conv2d_int8:N=1,C=64,H=8,W=8,K=64,R=3,S=3,pad=1,groups=64"):
        geo = _geometry(parse_workload(key))
        kinds[key] = ("expanded" if isinstance(geo, ExpandedGeometry) else
                      "tiles" if isinstance(geo, TileGeometry) else "vector")
    assert list(kinds.values()) == ["tiles", "expanded", "expanded", "vector", "vector",
                                    "vector", "vector"]


def test_expanded_planes_pad_the_words_to_whole_steps():
    from schedule_templates.templates.x86_expanded import ExpandedGeometry

    geo = ExpandedGeometry(parse_workload(
        "conv2d_int8:N=1,C=3,H=224,W=224,K=64,R=7,S=7,stride=2,pad=3"), x86_dot_gemm.VNNI)
    assert (geo.words, geo.gemm_words) == (49, 64)
    # 3.2 MB of planes for the whole map: bands of 16 output rows (458 KB), in place
    assert (geo.band_rows, geo.bands, geo.gemm_columns, geo.gemm_in_place) == (16, 7, 1792,
                                                                              True)
    assert geo.gemm_offsets().tolist() == [w * 1792 for w in range(64)]
    odd = ExpandedGeometry(parse_workload("conv2d_int8:N=1,C=5,H=9,W=9,K=8,R=3,S=3,pad=1"),
                           x86_dot_gemm.VNNI)
    assert (odd.words, odd.gemm_words, odd.gemm_columns, odd.gemm_in_place) == (18, 32, 96,
                                                                               False)
    bf16 = ExpandedGeometry(parse_workload(
        "conv2d_bf16:N=1,C=3,H=224,W=224,K=64,R=7,S=7,stride=2,pad=3"), x86_dot_gemm.BF16)
    assert (bf16.words, bf16.gemm_words) == (98, 112)  # two channels a word


def test_bf16_stem_takes_expanded_planes_where_tiles_are(monkeypatch):
    """``--precision bf16`` keeps a layer fp32 on an AMX host unless it runs on tiles; an RGB
    stem now does, through expanded planes."""
    from tuner_service.compiler.frontend import precision

    stem = parse_workload("conv2d:N=1,C=3,H=224,W=224,K=64,R=7,S=7,stride=2,pad=3,"
                          "epilogue=bias+relu")
    monkeypatch.setattr(precision, "host_amx", lambda dot="tdpbusd": True)
    assert precision.at_precision(stem, "bf16").op == "conv2d_bf16"
    monkeypatch.setattr(x86_amx_gemm, "host_amx", lambda dot="tdpbusd": True)
    workload = precision.at_precision(stem, "bf16")
    template = get_template(workload.op)
    asm = _sapphire_rapids_asm(lower(workload, template, template.default_config(workload)))
    assert asm.count("tdpbf16ps") >= 2 and "vdpbf16ps" not in asm


def test_amx_blocking_tiles_the_padded_extents():
    space = x86_dot_gemm.dot_space(128, 768, 192, x86_dot_gemm.VNNI)
    for index in range(0, space.size, max(1, space.size // 200)):
        if not space.is_valid(index):
            continue
        plan = x86_amx_gemm.amx_blocking(space.get(index), 128, 768)
        assert plan.M == 128 and plan.N == 768 and plan.rows == 2
        assert plan.M % plan.block_m == 0 and plan.block_m % 32 == 0
        assert plan.N % plan.block_n == 0 and plan.block_n % 32 == 0
    small = x86_amx_gemm.amx_blocking(x86_dot_gemm.dot_space(1, 1008, 4, x86_dot_gemm.VNNI)
                                      .get(0), 1, 1000)
    assert (small.rows, small.M, small.N) == (1, 16, 1024)


def test_passes_that_do_not_know_tiles_see_their_expansion(monkeypatch):
    """The printer and the cost model's features read a tile kernel through ``expand``."""
    monkeypatch.setattr(x86_dot_gemm, "int8_instruction", lambda narrow=False: x86_dot_gemm.VNNI)
    monkeypatch.setattr(x86_amx_gemm, "host_amx", lambda dot="tdpbusd": True)
    workload = parse_workload("dense_int8:M=64,N=64,K=64")
    template = get_template(workload.op)
    config = template.default_config(workload)
    assert "dp4a" in format_kernel(template.lower(workload, config))
    row = FeatureExtractor(template, workload).row(config.index)
    assert row is not None and np.isfinite(row).all()


needs_amx_bf16 = pytest.mark.skipif(not x86_amx_gemm.host_amx("tdpbf16ps"),
                                    reason="this host (CPU or kernel) grants no AMX-BF16 tiles")


@needs_amx_bf16
@pytest.mark.parametrize("key", [
    "dense_bf16:M=128,N=768,K=768,data=f32",
    "dense_bf16:M=37,N=64,K=100,data=f32,epilogue=bias+gelu",  # rows, K padded (+0.0 past K)
    "dense_bf16:M=5,N=32,K=48",  # bf16 rows not whole blocks: the vector kernel
    "dense_bf16:M=32,N=96,K=64,epilogue=bias",  # bf16 rows read in place
    "conv2d_bf16:N=1,C=32,H=9,W=7,K=40,R=3,S=3,pad=1,epilogue=bias+relu",
    "conv2d_bf16:N=2,C=64,H=8,W=8,K=32,R=1,S=1,stride=2,epilogue=bias+residual",
    "conv2d_bf16:N=1,C=64,H=7,W=7,K=64,R=3,S=3,pad=1,groups=2",
    "conv2d_bf16:N=1,C=32,H=14,W=14,K=64,R=1,S=1,epilogue=scale+bias+residual+relu",
])
@pytest.mark.parametrize("threads", [1, 2])
def test_bf16_on_tiles_matches_the_rounded_reference(key, threads):
    from tests.schedule_templates.test_core_lowp import run

    out, ref, asm = run(key, threads=threads)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    assert ("tdpbf16ps" in asm) == ("M=5," not in key)


@pytest.mark.parametrize("key", ["dense_bf16:M=197,N=2304,K=768,data=f32,epilogue=bias",
                                 "conv2d_bf16:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1"])
def test_bf16_on_tiles_compiles_for_sapphire_rapids(monkeypatch, key):
    monkeypatch.setattr(x86_amx_gemm, "host_amx", lambda dot="tdpbusd": True)
    workload = parse_workload(key)
    template = get_template(workload.op)
    asm = _sapphire_rapids_asm(lower(workload, template, template.default_config(workload)))
    assert asm.count("tdpbf16ps") >= 2 and "vdpbf16ps" not in asm


@pytest.mark.parametrize("dot", ["tdpbusd", "tdpbf16ps"])
def test_tile_peak_loop_is_four_tile_products_a_step(dot):
    from schedule_templates.peak import tile_peak_kernel

    asm = _sapphire_rapids_asm(tile_peak_kernel(2, dot))
    assert asm.count(dot) >= 4 and asm.count("tileloadd") >= 4
    if x86_amx_gemm.host_amx(dot):
        from schedule_templates.peak import measure_tile_peak_gops

        assert measure_tile_peak_gops(1, dot, repeat=1) > 0


@pytest.mark.parametrize(("key", "threads"), [
    ("conv2d_int8:N=2,C=3,H=16,W=16,K=32,R=3,S=3,pad=1,bias=s32,residual=u8", 1),
    ("conv2d_int8:N=1,C=3,H=32,W=32,K=40,R=7,S=7,stride=2,pad=3,out=s8", 2),
    ("conv2d_bf16:N=2,C=3,H=16,W=16,K=32,R=3,S=3,pad=1,epilogue=bias+residual+relu", 2),
])
def test_expanded_planes_in_bands_match_the_reference(monkeypatch, key, threads):
    """With less room for planes than a map needs, the expansion and the GEMM run band by band
    (rows that make whole 32-pixel blocks), each band's pixels stored in place."""
    from schedule_templates.templates import x86_expanded
    from schedule_templates.templates.x86_expanded import ExpandedGeometry

    dot = "tdpbf16ps" if "bf16" in key else "tdpbsud"
    if not x86_amx_gemm.host_amx(dot):
        pytest.skip("this host (CPU or kernel) grants no AMX tile registers")
    monkeypatch.setattr(x86_expanded, "BAND_BYTES", 8192)
    workload = parse_workload(key)
    inst = x86_dot_gemm.BF16 if "bf16" in key else x86_dot_gemm.VNNI
    geo = ExpandedGeometry(workload, inst)
    assert geo.bands > 1 and geo.gemm_in_place
    template = get_template(workload.op)
    artifact = build(workload, template, template.default_config(workload), threads=threads)
    try:
        inputs = workload.make_inputs(5)
        prepared = artifact.prepare(inputs)
        prepared.run()
        if "bf16" in key:
            np.testing.assert_allclose(prepared.output, workload.reference(inputs), rtol=1e-5,
                                       atol=1e-5)
        else:
            np.testing.assert_array_equal(prepared.output, workload.reference(inputs))
    finally:
        artifact.close()
