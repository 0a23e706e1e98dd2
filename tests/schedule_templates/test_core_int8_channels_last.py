"""``conv2d_int8`` on channels-last activations (``in_layout``/``out_layout``/
``residual_layout`` ``nhwc``, ``x86_channels_last``): exact for every combination of layouts,
padded or not, strided, dilated, batched, with threads and random configs; its space holds
pixel rows only; the reference is the NCHW one transposed; and the workload refuses what the
kernels cannot lay out. Kernel tests run with the host's instruction and forced onto
vpmaddwd (and, on AMX hosts, without tiles)."""

import numpy as np
import pytest

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.templates import x86_amx_gemm
from schedule_templates.templates.base import get_template
from schedule_templates.templates.x86_conv2d_int8 import _geometry
from schedule_templates.templates.x86_int8_phases import TileGeometry
from schedule_templates.templates.x86_pixel_rows import pk_tile
from schedule_templates.workloads import parse_workload
from tests.schedule_templates.test_core_int8 import run

KEYS = [
    "conv2d_int8:N=1,C=8,H=7,W=9,K=32,R=3,S=3,pad=1,bias=s32,in_layout=nhwc,out_layout=nhwc",
    "conv2d_int8:N=2,C=16,H=9,W=7,K=32,R=1,S=1,stride=2,in_layout=nhwc",  # read as it lies
    "conv2d_int8:N=1,C=12,H=6,W=5,K=16,R=1,S=1,out_layout=nhwc,out=s8,scale=tensor",
    "conv2d_int8:N=1,C=3,H=11,W=10,K=16,R=7,S=7,stride=2,pad=3,out_layout=nhwc",  # RGB stem
    "conv2d_int8:N=2,C=20,H=11,W=10,K=64,R=3,S=3,stride=2,pad=1,dilation=2,bias=s32,"
    "in_layout=nhwc,out_layout=nhwc",
    "conv2d_int8:N=1,C=8,H=8,W=6,K=32,R=3,S=2,stride=2x1,pad=0x1x1x0,in_layout=nhwc",
    "conv2d_int8:N=1,C=16,H=5,W=6,K=32,R=1,S=1,residual=s8,out=s8,in_layout=nhwc,"
    "residual_layout=nhwc",  # the shortcut channels-last, the output NCHW
    "conv2d_int8:N=1,C=16,H=5,W=6,K=32,R=3,S=3,pad=1,residual=u8,out_layout=nhwc",
    "conv2d_int8:N=2,C=8,H=7,W=7,K=48,R=1,S=1,bias=s32,residual=u8,in_layout=nhwc,"
    "out_layout=nhwc,residual_layout=nhwc",
    # four images: the threads split them, each padding its own image's map
    "conv2d_int8:N=4,C=8,H=5,W=6,K=16,R=3,S=3,pad=1,in_layout=nhwc,out_layout=nhwc",
]


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("threads", [1, 2])
def test_channels_last_conv_is_exact(instruction, key, threads):
    out, ref, _ = run(key, threads=threads)
    np.testing.assert_array_equal(out.reshape(ref.shape), ref)


@pytest.mark.parametrize("key", KEYS[:2] + KEYS[-1:])
def test_channels_last_random_configs_are_exact(key):
    workload = parse_workload(key)
    space = get_template("conv2d_int8").space(workload)
    for index in space.sample(4, np.random.default_rng(3)):
        config = space.get(index)
        entities = {name: value for name, _, value in config.entities}
        out, ref, _ = run(key, entities=entities, threads=2)
        np.testing.assert_array_equal(out.reshape(ref.shape), ref, err_msg=str(entities))


def test_channels_last_space_holds_pixel_rows_only():
    workload = parse_workload(KEYS[0])
    template = get_template("conv2d_int8")
    space = template.space(workload)
    picked = space.sample(64, np.random.default_rng(0))
    assert picked and all(pk_tile(space.get(i)) is not None for i in picked)
    assert pk_tile(template.default_config(workload)) is not None
    plain = parse_workload(KEYS[0].replace(",in_layout=nhwc,out_layout=nhwc", ""))
    plain_space = template.space(plain)
    assert any(pk_tile(plain_space.get(i)) is None
               for i in plain_space.sample(64, np.random.default_rng(0)))


def test_channels_last_layers_never_take_the_nchw_tiles(monkeypatch):
    """The NCHW tile kernel reads phase planes: on an AMX host a channels-last layer takes
    its own tile kernel (``x86_amx_channels_last``, tested in ``test_amx_channels_last``) or
    the vector pixel rows."""
    monkeypatch.setattr(x86_amx_gemm, "host_amx", lambda dot="tdpbusd": True)
    laid = parse_workload("conv2d_int8:N=1,C=64,H=8,W=8,K=64,R=1,S=1,in_layout=nhwc")
    assert not isinstance(_geometry(laid), TileGeometry)


@pytest.mark.parametrize("key", KEYS)
def test_channels_last_reference_is_the_nchw_one_transposed(key):
    workload = parse_workload(key)
    plain = parse_workload(key.replace(",in_layout=nhwc", "").replace(",out_layout=nhwc", "")
                           .replace(",residual_layout=nhwc", ""))
    inputs = plain.make_inputs(1)
    laid = dict(inputs)
    if workload.in_layout == "nhwc":
        laid["data"] = inputs["data"].transpose(0, 2, 3, 1).copy()
    if workload.residual_layout == "nhwc":
        laid["residual"] = inputs["residual"].transpose(0, 2, 3, 1).copy()
    want = plain.reference(inputs)
    if workload.out_layout == "nhwc":
        want = want.transpose(0, 2, 3, 1)
    got = workload.reference(laid)
    assert got.shape == workload.output_shape()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("key, message", [
    ("conv2d_int8:N=1,C=8,H=7,W=7,K=32,R=3,S=3,groups=2,out_layout=nhwc", "one group"),
    ("conv2d_int8:N=1,C=8,H=7,W=7,K=24,R=1,S=1,in_layout=nhwc", "K a multiple of 16"),
    ("conv2d_int8:N=1,C=6,H=7,W=7,K=32,R=1,S=1,in_layout=nhwc", "C a multiple of 4"),
    ("conv2d_int8:N=1,C=8,H=7,W=7,K=32,R=1,S=1,residual_layout=nhwc", "fused residual"),
])
def test_channels_last_workloads_refuse_what_cannot_be_laid_out(key, message):
    with pytest.raises(InvalidWorkloadError, match=message):
        parse_workload(key)


def test_channels_last_shares_no_records_with_nchw():
    """Another kernel, another key: the layouts are part of the (base) key."""
    laid = parse_workload(KEYS[-1])
    assert "in_layout=nhwc,out_layout=nhwc" in laid.base_key
    assert "residual" not in laid.base_key
    assert parse_workload(laid.base_key).residual_layout == "nchw"
