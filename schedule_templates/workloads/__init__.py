"""Workload definitions. Importing this package registers every operator."""

from schedule_templates.workloads.base import (
    Workload,
    make_workload,
    parse_workload,
    workload_class,
    workload_ops,
)
from schedule_templates.workloads.conv import Conv2d, DepthwiseConv2d, GroupConv2d
from schedule_templates.workloads.gemm import BatchMatmul, Dense

__all__ = [
    "BatchMatmul",
    "Conv2d",
    "Dense",
    "DepthwiseConv2d",
    "GroupConv2d",
    "Workload",
    "make_workload",
    "parse_workload",
    "workload_class",
    "workload_ops",
]
