"""Every CUDA template: random valid configs compile with nvcc for sm_90, and the same lowered
kernels, run serially on the host through the LLVM generator, match numpy."""

import ctypes

import numpy as np
import pytest

from schedule_templates.codegen.cuda_c import generate_cuda
from schedule_templates.codegen.llvm_ir import generate_llvm_ir
from schedule_templates.codegen.llvm_jit import CompiledKernel
from schedule_templates.errors import InvalidConfigError, InvalidWorkloadError
from schedule_templates.ir.gpu import serialize_for_host
from schedule_templates.runtime import NUMPY_DTYPES, lower
from schedule_templates.templates.base import all_templates, get_template
from schedule_templates.templates.cuda_tiling import DeviceLimits, GemmTiles
from schedule_templates.workloads import parse_workload, workload_class

TARGET = "cuda -arch=sm_90"
RESNET18 = [
    "conv2d:N=1,C=3,H=224,W=224,K=64,R=7,S=7,stride=2,pad=3",
    "conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1",
    "conv2d:N=1,C=64,H=56,W=56,K=128,R=1,S=1,stride=2",
    "conv2d:N=1,C=128,H=28,W=28,K=256,R=3,S=3,stride=2,pad=1",
    "conv2d:N=1,C=256,H=14,W=14,K=256,R=3,S=3,pad=1",
    "conv2d:N=1,C=512,H=7,W=7,K=512,R=3,S=3,pad=1",
]
#: big and odd shapes for the compile check (tiles rarely divide the odd ones)
COMPILE = {
    "dense": ["dense:M=4096,N=4096,K=4096", "dense:M=1,N=1000,K=512", "dense:M=37,N=70,K=33"],
    "batch_matmul": ["batch_matmul:B=12,M=128,N=128,K=64", "batch_matmul:B=3,M=50,N=30,K=7"],
    "conv2d": [*RESNET18[:3], "conv2d:N=2,C=5,H=9,W=11,K=6,R=3,S=2,stride=2x1,pad=0x1x2x0"],
    "depthwise_conv2d": ["depthwise_conv2d:N=1,C=32,H=112,W=112,R=3,S=3,pad=1",
                         "depthwise_conv2d:N=1,C=960,H=7,W=7,R=3,S=3,pad=1",
                         "depthwise_conv2d:N=2,C=3,H=7,W=9,R=3,S=2,stride=2x1,pad=0x1x1x0,"
                         "multiplier=2"],
}
#: small shapes for the host run (serial execution of every block and thread)
HOST = {
    "dense": ["dense:M=64,N=48,K=40", "dense:M=13,N=7,K=11", "dense:M=37,N=70,K=36"],
    "batch_matmul": ["batch_matmul:B=3,M=16,N=32,K=8", "batch_matmul:B=2,M=7,N=5,K=3"],
    "conv2d": [
        "conv2d:N=1,C=8,H=10,W=10,K=32,R=3,S=3,pad=1",
        "conv2d:N=1,C=3,H=15,W=15,K=16,R=7,S=7,stride=2,pad=3",
        "conv2d:N=2,C=5,H=6,W=7,K=6,R=3,S=2,stride=2x1,pad=0x1x2x0,dilation=2x1",
        "conv2d:N=1,C=16,H=8,W=8,K=32,R=1,S=1",
    ],
    "depthwise_conv2d": [
        "depthwise_conv2d:N=1,C=8,H=12,W=12,R=3,S=3,pad=1",
        "depthwise_conv2d:N=2,C=3,H=7,W=9,R=3,S=2,stride=2x1,pad=0x1x1x0,multiplier=2",
        "depthwise_conv2d:N=1,C=5,H=9,W=9,R=3,S=3,stride=2",
    ],
}
# any other CUDA template (a new one) is checked on the examples of its workload class, plus
# big shapes where this file lists some
BIG = {
    "dense_int8": ["dense_int8:M=4096,N=4096,K=4096", "dense_int8:M=1,N=1000,K=2048,out=f32"],
    "conv2d_int8": [
        "conv2d_int8:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1",
        "conv2d_int8:N=1,C=3,H=224,W=224,K=64,R=7,S=7,stride=2,pad=3,bias=s32",
        "conv2d_int8:N=1,C=96,H=56,W=56,K=96,R=3,S=3,pad=1,groups=96"],
    "group_conv2d": ["group_conv2d:N=1,C=512,H=14,W=14,K=512,R=3,S=3,pad=1,groups=32",
                     "group_conv2d:N=1,C=224,H=56,W=56,K=224,R=3,S=3,stride=2,pad=1,groups=28"],
}
for _template in all_templates():
    if _template.target_kind == "cuda" and _template.op not in COMPILE:
        # channels-last int8 layers (``layout=nhwc``) are an x86 layout and saturating sums
        # (``weights=sat16``) an x86 arithmetic: the CUDA templates refuse them
        # (test_cuda_refuses_channels_last, test_cuda_refuses_sat16)
        _examples = [key for key in workload_class(_template.op).examples
                     if "layout=nhwc" not in key and "weights=sat16" not in key]
        COMPILE[_template.op] = [*BIG.get(_template.op, []), *_examples[:2]]
        HOST[_template.op] = _examples


def sources(keys, per_workload, seed):
    """(label, CUDA C) for the default and ``per_workload`` random valid configs of each key."""
    rng = np.random.default_rng(seed)
    out = []
    for key in keys:
        workload = parse_workload(key)
        template = get_template(workload.op, TARGET)
        space = template.space(workload)
        indices = [template.default_config(workload).index, *space.sample(per_workload, rng)]
        for index in dict.fromkeys(indices):
            name = f"k{len(out)}"
            cuda = generate_cuda(lower(workload, template, space.get(index)), name=name)
            out.append((f"{key} config {index}", cuda.source))
    return out


def run_on_host(key, index=None, seed=3):
    """Lower one config, run its serial host form, and compare with the numpy reference."""
    workload = parse_workload(key)
    template = get_template(workload.op, TARGET)
    config = (template.default_config(workload) if index is None
              else template.space(workload).get(index))
    kernel = serialize_for_host(lower(workload, template, config))
    inputs = workload.make_inputs(seed)
    packed = template.pack(workload, config, inputs)
    arrays = [np.ascontiguousarray(packed[b.name], dtype=NUMPY_DTYPES[b.dtype]).reshape(-1)
              for b in kernel.params[:-1]]
    out = np.zeros(kernel.output.size, dtype=NUMPY_DTYPES[kernel.output.dtype])
    if out.dtype == np.float32:
        out[:] = np.nan  # an output the kernel never writes fails the comparison
    compiled = CompiledKernel(generate_llvm_ir(kernel), kernel.name, len(arrays) + 1)
    try:
        compiled.function(*[ctypes.c_void_p(a.ctypes.data) for a in [*arrays, out]], 1)
    finally:
        compiled.close()
    reference = workload.reference(inputs)
    reduction = workload.flops() / (2 * reference.size)
    np.testing.assert_allclose(out.reshape(reference.shape), reference, rtol=1e-4,
                               atol=1e-5 * np.sqrt(reduction) + 1e-6,
                               err_msg=f"{key} config {config.index}")


def test_every_operator_has_a_cuda_template():
    cuda = {t.op: t for t in all_templates() if t.target_kind == "cuda"}
    assert set(cuda) == set(COMPILE)
    for op, template in cuda.items():
        assert get_template(op, TARGET) is template
        assert template.name == f"{op}.cuda"


@pytest.mark.parametrize("op", sorted(COMPILE))
def test_random_configs_compile_with_nvcc(op, nvcc_compile):
    nvcc_compile(sources(COMPILE[op], per_workload=1, seed=len(op)))


@pytest.mark.slow
@pytest.mark.parametrize("op", sorted(COMPILE))
def test_many_random_configs_compile_with_nvcc(op, nvcc_compile):
    keys = [*COMPILE[op], *HOST[op], *(RESNET18 if op == "conv2d" else [])]
    nvcc_compile(sources(keys, per_workload=4, seed=100 + len(op)))


@pytest.mark.parametrize("op, key", [(op, k) for op, keys in HOST.items() for k in keys])
def test_random_configs_match_numpy_on_the_host(op, key):
    workload = parse_workload(key)
    space = get_template(op, TARGET).space(workload)
    run_on_host(key)
    for index in space.sample(1, np.random.default_rng(sum(map(ord, key)))):
        run_on_host(key, index)


@pytest.mark.slow
@pytest.mark.parametrize("op, key", [(op, k) for op, keys in HOST.items() for k in keys])
def test_more_random_configs_match_numpy_on_the_host(op, key):
    space = get_template(op, TARGET).space(parse_workload(key))
    for index in space.sample(4, np.random.default_rng(7 + len(key))):
        run_on_host(key, index)


@pytest.mark.parametrize("key", [
    "dense:M=20,N=24,K=16,epilogue=bias+relu",
    "conv2d:N=1,C=4,H=6,W=6,K=8,R=3,S=3,pad=1,epilogue=scale+bias+residual+relu6",
    "depthwise_conv2d:N=1,C=4,H=7,W=7,R=3,S=3,pad=1,epilogue=bias+relu",
    "group_conv2d:N=1,C=8,H=6,W=7,K=12,R=3,S=3,pad=1,groups=4,epilogue=scale+bias+residual+relu",
    "group_conv2d:N=2,C=6,H=1,W=9,K=6,R=1,S=3,stride=2,groups=2,epilogue=bias+relu6",
])
def test_fused_epilogues_match_numpy_on_the_host(key):
    run_on_host(key)


def test_device_limits_filter_configs_but_keep_indices():
    workload = parse_workload("dense:M=1024,N=1024,K=1024")
    template = get_template("dense", TARGET)
    small = {"max_threads_per_block": 128, "max_shared_memory_per_block": 8192,
             "max_registers_per_block": 16384, "warp_size": 32}
    default, limited = template.space(workload), template.space(workload, small)
    assert default.knobs == limited.knobs and default.size == limited.size
    rng = np.random.default_rng(0)
    sampled = limited.sample(200, rng)
    assert sampled
    for index in sampled:
        tiles = GemmTiles.of(limited.get(index))
        assert tiles.threads <= 128 and tiles.shared_bytes <= 8192
        assert tiles.threads * tiles.registers <= 16384
    big = template.default_config(workload)  # 256 threads: valid by default, not on `small`
    assert default.is_valid(big.index) and not limited.is_valid(big.index)


def test_device_report_is_read_defensively():
    limits = DeviceLimits.from_device({"max_threads_per_block": "many", "warp_size": 64,
                                       "compute_capability": "sm_80", "unknown": 1})
    assert limits.max_threads_per_block == 1024 and limits.warp_size == 64
    assert limits.compute_capability == "sm_80"
    assert DeviceLimits.from_device(None) == DeviceLimits()


def test_default_dense_is_the_classic_tile():
    workload = parse_workload("dense:M=4096,N=4096,K=4096")
    template = get_template("dense", TARGET)
    tiles = GemmTiles.of(template.default_config(workload))
    assert (tiles.bm, tiles.bn, tiles.mr, tiles.nr, tiles.threads) == (128, 128, 8, 8, 256)
    cuda = generate_cuda(template.lower(workload, template.default_config(workload)))
    assert (cuda.grid, cuda.block) == ((32, 32, 1), (16, 16, 1))
    assert "float4" in cuda.source and "__syncthreads();" in cuda.source


@pytest.mark.parametrize("op, keys", sorted(COMPILE.items()))
def test_defaults_are_valid_everywhere(op, keys):
    template = get_template(op, TARGET)
    for key in [*keys, *HOST[op]]:
        workload = parse_workload(key)
        config = template.default_config(workload)
        template.check(workload, config)


def test_filtered_config_is_refused():
    workload = parse_workload("dense:M=64,N=64,K=64")
    template = get_template("dense", TARGET)
    space = template.space(workload)
    bad = next(i for i in range(space.size) if not space.is_valid(i))
    with pytest.raises(InvalidConfigError):
        lower(workload, template, space.get(bad))


@pytest.mark.parametrize("key", ["group_conv2d:N=1,C=128,H=56,W=56,K=128,R=3,S=3,pad=1,groups=32",
                                 "group_conv2d:N=1,C=64,H=28,W=28,K=64,R=3,S=3,pad=1,groups=8"])
def test_default_grouped_conv_fills_the_gpu(key):
    """A group's GEMM is small: the default shrinks its tiles until every SM gets a block."""
    workload = parse_workload(key)
    template = get_template(workload.op, TARGET)
    cuda = generate_cuda(template.lower(workload, template.default_config(workload)))
    blocks = cuda.grid[0] * cuda.grid[1] * cuda.grid[2]
    assert blocks >= DeviceLimits().multiprocessor_count
    assert cuda.grid[2] == workload.groups


@pytest.mark.parametrize("key, small", [
    ("conv2d:N=1,C=256,H=14,W=14,K=256,R=3,S=3,pad=1", True),  # 4 classic blocks
    ("conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1", True),  # 25
    ("conv2d:N=1,C=3,H=224,W=224,K=64,R=7,S=7,stride=2,pad=3", False),  # 98: keeps the classic
    ("conv2d:N=8,C=64,H=56,W=56,K=256,R=1,S=1", False),
])
def test_default_conv_takes_the_measured_small_grid_tile(key, small, nvcc_compile):
    """Where the classic tile leaves over half of the SMs idle, the conv default is the 64x16
    tile measured on an H200 (docs/cuda.md); it lowers and compiles like any other config."""
    workload = parse_workload(key)
    template = get_template(workload.op, TARGET)
    config = template.default_config(workload)
    tiles = GemmTiles.of(config)
    assert ((tiles.bm, tiles.bn, tiles.threads) == (64, 16, 128)) is small
    cuda = generate_cuda(template.lower(workload, config))
    nvcc_compile([(key, cuda.source)])


@pytest.mark.parametrize("key", ["dense_int8:M=5,N=40,K=22,weights=sat16",
                                 "conv2d_int8:N=1,C=8,H=7,W=9,K=32,R=3,S=3,weights=sat16"])
def test_cuda_refuses_sat16(key):
    workload = parse_workload(key)
    with pytest.raises(InvalidWorkloadError, match="x86 arithmetic"):
        get_template(workload.op, TARGET).default_config(workload)


def test_cuda_refuses_channels_last():
    key = "conv2d_int8:N=1,C=8,H=7,W=9,K=32,R=3,S=3,pad=1,in_layout=nhwc,out_layout=nhwc"
    with pytest.raises(InvalidWorkloadError, match="x86 layout"):
        get_template("conv2d_int8", TARGET).default_config(parse_workload(key))
