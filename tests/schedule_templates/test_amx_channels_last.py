"""Channels-last ``conv2d_int8`` layers on AMX tiles (``x86_amx_channels_last``): exact for
every input and output layout, padded, strided, dilated, batched, read in place with slack or
from a staged map, with threads and random configs. On an AMX host the tile kernels run; on
every host the same kernels run with each tile product replaced by its expansion (the same
sums lane by lane), so the indexing is checked wherever the tests run; and the tile kernel
compiles to tile instructions for Sapphire Rapids."""

import dataclasses

import numpy as np
import pytest

from schedule_templates.ir.amx import TileMatmul
from schedule_templates.ir.nodes import Kernel, Stmt
from schedule_templates.ir.visitor import StmtMutator
from schedule_templates.runtime import lower
from schedule_templates.templates import x86_amx_gemm, x86_dot_gemm
from schedule_templates.templates.base import get_template
from schedule_templates.templates.x86_amx_channels_last import TileMap
from schedule_templates.templates.x86_conv2d_int8 import Conv2dInt8X86, _channels_last_tiles
from schedule_templates.workloads import parse_workload
from tests.schedule_templates.test_amx import _sapphire_rapids_asm, needs_amx
from tests.schedule_templates.test_core_int8 import run

KEYS = [
    # padded 3x3: a staged map, phase-width rows (two dropped pixels a row)
    "conv2d_int8:N=1,C=64,H=7,W=9,K=32,R=3,S=3,pad=1,bias=s32,in_layout=nhwc,out_layout=nhwc",
    # 1x1 read in place: 30 pixels computed as 32 rows (slack past the second image)
    "conv2d_int8:N=2,C=64,H=6,W=5,K=64,R=1,S=1,bias=s32,in_layout=nhwc,out_layout=nhwc",
    # strided 3x3: four phases
    "conv2d_int8:N=1,C=128,H=9,W=7,K=64,R=3,S=3,stride=2,pad=1,bias=s32,in_layout=nhwc,"
    "out_layout=nhwc",
    # strided 1x1 with the shortcut added: one phase staged
    "conv2d_int8:N=1,C=64,H=8,W=6,K=96,R=1,S=1,stride=2,residual=u8,in_layout=nhwc,"
    "out_layout=nhwc,residual_layout=nhwc",
    # an NCHW input (after a pool): gathered into the map
    "conv2d_int8:N=1,C=64,H=7,W=19,K=32,R=1,S=1,bias=s32,out_layout=nhwc",
    "conv2d_int8:N=1,C=64,H=6,W=5,K=32,R=3,S=3,stride=2,pad=1,out_layout=nhwc",
    # an NCHW output (before a pool) with a channels-last shortcut, s8
    "conv2d_int8:N=1,C=64,H=5,W=6,K=64,R=3,S=3,pad=1,residual=s8,out=s8,in_layout=nhwc,"
    "residual_layout=nhwc",
    # dilated, asymmetric padding and stride, one scale
    "conv2d_int8:N=2,C=64,H=7,W=7,K=32,R=3,S=2,stride=2x1,pad=0x1x1x0,dilation=2,"
    "scale=tensor,in_layout=nhwc,out_layout=nhwc",
    # more than 16 rows of 32 columns, an NCHW shortcut
    "conv2d_int8:N=1,C=192,H=9,W=8,K=96,R=1,S=1,residual=u8,in_layout=nhwc",
]


class _Expand(StmtMutator):
    def visit_tile_matmul(self, s: TileMatmul) -> Stmt:
        return self.visit_stmt(s.expand())


def _expanded(kernel: Kernel) -> Kernel:
    mutator = _Expand()
    return dataclasses.replace(kernel, body=tuple(mutator.visit_stmt(s) for s in kernel.body))


@pytest.fixture
def tiles_expanded(monkeypatch):
    """The tile kernels as an AMX host lowers them, each tile product expanded."""
    monkeypatch.setattr(x86_dot_gemm, "int8_instruction", lambda narrow=False: x86_dot_gemm.VNNI)
    monkeypatch.setattr(x86_amx_gemm, "host_amx", lambda dot="tdpbusd": True)
    real = Conv2dInt8X86.lower
    monkeypatch.setattr(Conv2dInt8X86, "lower",
                        lambda self, wl, config: _expanded(real(self, wl, config)))


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("threads", [1, 2])
def test_channels_last_tiles_expanded_are_exact(tiles_expanded, key, threads):
    workload = parse_workload(key)
    assert _channels_last_tiles(workload)
    out, ref, _ = run(key, threads=threads)
    np.testing.assert_array_equal(out.reshape(ref.shape), ref)


@needs_amx
@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("threads", [1, 2])
def test_channels_last_tiles_are_exact(key, threads):
    out, ref, asm = run(key, threads=threads)
    assert "tdpbusd" in asm
    np.testing.assert_array_equal(out.reshape(ref.shape), ref)


@pytest.mark.parametrize("key", [KEYS[0], KEYS[2], KEYS[4]])
def test_channels_last_tiles_random_configs_are_exact(tiles_expanded, key):
    workload = parse_workload(key)
    space = get_template("conv2d_int8").space(workload)
    for index in space.sample(4, np.random.default_rng(5)):
        entities = {name: value for name, _, value in space.get(index).entities}
        out, ref, _ = run(key, entities=entities, threads=2)
        np.testing.assert_array_equal(out.reshape(ref.shape), ref, err_msg=str(entities))


def test_channels_last_layers_take_tiles_for_whole_steps(monkeypatch):
    """Tiles where the input channels are whole 64-byte steps and the output channels whole
    32-column register blocks; the vector pixel rows else."""
    monkeypatch.setattr(x86_dot_gemm, "int8_instruction", lambda narrow=False: x86_dot_gemm.VNNI)
    monkeypatch.setattr(x86_amx_gemm, "host_amx", lambda dot="tdpbusd": True)
    base = "conv2d_int8:N=1,C={c},H=8,W=8,K={k},R=1,S=1,in_layout=nhwc"
    assert _channels_last_tiles(parse_workload(base.format(c=64, k=64)))
    assert not _channels_last_tiles(parse_workload(base.format(c=32, k=64)))
    assert not _channels_last_tiles(parse_workload(base.format(c=64, k=48)))
    plain = parse_workload("conv2d_int8:N=1,C=64,H=8,W=8,K=64,R=1,S=1")
    assert not _channels_last_tiles(plain)  # NCHW layers keep their own tile kernel
    monkeypatch.setattr(x86_amx_gemm, "host_amx", lambda dot="tdpbusd": False)
    assert not _channels_last_tiles(parse_workload(base.format(c=64, k=64)))


def test_tile_rows_lie_one_pixel_apart():
    """Phase-width rows: tap (r, s) of row q reads phase ``(r % sh, s % sw)`` at ``q`` plus a
    fixed offset, so 16 rows are one strided tile load."""
    tiles = TileMap(parse_workload(KEYS[2]))
    assert (tiles.phase_h, tiles.phase_w, tiles.phases) == (6, 5, 4)
    assert tiles.rows == (tiles.wl.out_h - 1) * 5 + tiles.wl.out_w
    cw = 32
    offsets = tiles.tap_offsets()
    assert offsets.shape == (9 * cw,)
    # tap (1, 1): phase 3 at (0, 0); tap (2, 2): phase 0 at (1, 1)
    assert offsets[4 * cw] == 3 * tiles.phase_words
    assert offsets[8 * cw + 5] == (5 + 1) * cw + 5


@pytest.mark.parametrize("key", [KEYS[0], KEYS[1], KEYS[4]])
def test_channels_last_tiles_compile_for_sapphire_rapids(monkeypatch, key):
    monkeypatch.setattr(x86_dot_gemm, "int8_instruction", lambda narrow=False: x86_dot_gemm.VNNI)
    monkeypatch.setattr(x86_amx_gemm, "host_amx", lambda dot="tdpbusd": True)
    workload = parse_workload(key)
    template = get_template(workload.op)
    kernel = lower(workload, template, template.default_config(workload))
    assert kernel.name == "conv2d_int8_amx"
    asm = _sapphire_rapids_asm(kernel)
    assert asm.count("tdpbusd") >= 4 and asm.count("tileloadd") >= 4
    assert "vpdpbusd" not in asm
