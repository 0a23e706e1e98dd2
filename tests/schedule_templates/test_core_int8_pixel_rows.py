"""``conv2d_int8``'s second orientation, pixel rows (``pk_tile``): exact on odd shapes, with
blocked reductions and threads, one config per kernel, and the default's choice of orientation.
Kernel tests run with the host's instruction and, on a VNNI host, forced onto vpmaddwd."""

import numpy as np
import pytest

from schedule_templates.templates import x86_dot_gemm
from schedule_templates.templates.base import get_template
from schedule_templates.templates.x86_int8_phases import Geometry
from schedule_templates.workloads import parse_workload
from tests.schedule_templates.conftest import HAS_VNNI
from tests.schedule_templates.test_core_int8 import run


def _pixel_rows(key, rows, width, **entities):
    """The default config of ``key`` turned to pixel rows with that register tile."""
    workload = parse_workload(key)
    template = get_template("conv2d_int8")
    base = {name: value for name, _, value in template.default_config(workload).entities}
    columns = Geometry(workload, x86_dot_gemm.VNNI).columns
    return {**base, "tile_m": (workload.group_out, 1, 1), "tile_n": (columns // 16, 1, 16),
            "pk_tile": f"{rows}x{width}", **entities}


@pytest.mark.parametrize("key, rows, width", [
    ("conv2d_int8:N=1,C=8,H=7,W=9,K=16,R=3,S=3,pad=1", 12, 16),  # 63 pixels: a partial tile
    ("conv2d_int8:N=2,C=6,H=9,W=8,K=32,R=3,S=3,stride=2,pad=1,out=f32", 7, 32),
    ("conv2d_int8:N=1,C=12,H=6,W=5,K=64,R=1,S=1,out=s8,scale=tensor,bias=s32", 4, 64),
    ("conv2d_int8:N=1,C=8,H=8,W=6,K=64,R=3,S=2,stride=2x1,pad=0x1x1x0,groups=4", 12, 16),
    ("conv2d_int8:N=1,C=3,H=15,W=13,K=32,R=7,S=7,stride=2,pad=3", 5, 64),  # K < width: no
    ("conv2d_int8:N=1,C=3,H=15,W=13,K=32,R=7,S=7,stride=2,pad=3", 6, 32),
    ("conv2d_int8:N=2,C=5,H=11,W=10,K=64,R=3,S=3,stride=2,pad=1,dilation=2,out=s8,bias=s32",
     8, 32),
])
@pytest.mark.parametrize("threads", [1, 2])
def test_conv_int8_pixel_rows_is_exact(instruction, key, rows, width, threads):
    workload = parse_workload(key)
    entities = _pixel_rows(key, rows, width)
    space = get_template("conv2d_int8").space(workload)
    if workload.group_out % width:  # a tile wider than the output channels: not in the space
        assert not space.constraint(space.from_entities(entities))
        return
    out, ref, _ = run(key, entities=entities, threads=threads)
    np.testing.assert_array_equal(out, ref)


def test_conv_int8_pixel_rows_blocked_reduction():
    # 18 groups of K in three blocks: partial sums of pixel rows through the workspace
    key = "conv2d_int8:N=2,C=8,H=7,W=8,K=16,R=3,S=3,pad=1,out=s8,bias=s32"
    entities = _pixel_rows(key, 12, 16, tile_k=(3, 3, 2), parallel="n")
    out, ref, _ = run(key, entities=entities, threads=2)
    np.testing.assert_array_equal(out, ref)


def test_conv_int8_orientations_do_not_duplicate_configs():
    workload = parse_workload("conv2d_int8:N=1,C=16,H=7,W=7,K=32,R=3,S=3,pad=1")
    space = get_template("conv2d_int8").space(workload)
    base = _pixel_rows(workload.key, 6, 32)
    assert space.constraint(space.from_entities(base))
    # pixel rows ignore tile_m and tile_n: one value each is valid
    assert not space.constraint(space.from_entities({**base, "tile_m": (2, 1, 16)}))
    assert not space.constraint(space.from_entities({**base, "tile_n": (2, 1, 32)}))
    # random sampling still finds valid configs of both kinds' spaces
    assert len(space.sample(20, np.random.default_rng(0))) == 20


@pytest.mark.skipif(not HAS_VNNI, reason="the pixel-row default is for VNNI hosts")
@pytest.mark.parametrize("key, orient", [
    ("conv2d_int8:N=1,C=512,H=7,W=7,K=512,R=3,S=3,pad=1,bias=s32", "pk"),  # 49 of 64 columns
    ("conv2d_int8:N=1,C=256,H=14,W=14,K=256,R=3,S=3,pad=1,bias=s32", "pk"),  # 196 of 224
    ("conv2d_int8:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1,bias=s32", "kp"),  # 3136 of 3248
    ("conv2d_int8:N=1,C=128,H=28,W=28,K=512,R=1,S=1,bias=s32", "kp"),  # stored in place
])
def test_conv_int8_default_orientation_follows_the_dropped_columns(key, orient):
    config = get_template("conv2d_int8").default_config(parse_workload(key))
    assert (config["pk_tile"] != "none") == (orient == "pk")
