"""Workload definitions. Importing this package registers every operator."""

from schedule_templates.workloads.base import (
    Workload,
    make_workload,
    parse_workload,
    workload_class,
    workload_ops,
)
from schedule_templates.workloads.bf16_conv import Conv2dBf16
from schedule_templates.workloads.conv import Conv2d, DepthwiseConv2d, GroupConv2d
from schedule_templates.workloads.conv_nchwc import Conv2dNCHWc, DepthwiseConv2dNCHWc
from schedule_templates.workloads.gemm import BatchMatmul, Dense
from schedule_templates.workloads.group_nchwc import GroupConv2dNCHWc
from schedule_templates.workloads.lowp import BatchMatmulBf16, DenseBf16, DenseInt8
from schedule_templates.workloads.quant_conv import Conv2dInt8

__all__ = [
    "BatchMatmul",
    "BatchMatmulBf16",
    "Conv2d",
    "Conv2dBf16",
    "Conv2dInt8",
    "Conv2dNCHWc",
    "Dense",
    "DenseBf16",
    "DenseInt8",
    "DepthwiseConv2d",
    "DepthwiseConv2dNCHWc",
    "GroupConv2d",
    "GroupConv2dNCHWc",
    "Workload",
    "make_workload",
    "parse_workload",
    "workload_class",
    "workload_ops",
]
