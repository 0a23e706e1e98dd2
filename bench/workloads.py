"""The workloads the kernel benchmarks report on (ResNet-18 at 224x224, MobileNet-v2, BERT)."""

from __future__ import annotations

RESNET18_CONVS = [
    "conv2d:N=1,C=3,H=224,W=224,K=64,R=7,S=7,stride=2,pad=3",
    "conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1",
    "conv2d:N=1,C=64,H=56,W=56,K=128,R=3,S=3,stride=2,pad=1",
    "conv2d:N=1,C=64,H=56,W=56,K=128,R=1,S=1,stride=2",
    "conv2d:N=1,C=128,H=28,W=28,K=128,R=3,S=3,pad=1",
    "conv2d:N=1,C=128,H=28,W=28,K=256,R=3,S=3,stride=2,pad=1",
    "conv2d:N=1,C=128,H=28,W=28,K=256,R=1,S=1,stride=2",
    "conv2d:N=1,C=256,H=14,W=14,K=256,R=3,S=3,pad=1",
    "conv2d:N=1,C=256,H=14,W=14,K=512,R=3,S=3,stride=2,pad=1",
    "conv2d:N=1,C=256,H=14,W=14,K=512,R=1,S=1,stride=2",
    "conv2d:N=1,C=512,H=7,W=7,K=512,R=3,S=3,pad=1",
]
MOBILENET_V2_DEPTHWISE = [
    "depthwise_conv2d:N=1,C=32,H=112,W=112,R=3,S=3,pad=1",
    "depthwise_conv2d:N=1,C=96,H=112,W=112,R=3,S=3,stride=2,pad=1",
    "depthwise_conv2d:N=1,C=144,H=56,W=56,R=3,S=3,pad=1",
    "depthwise_conv2d:N=1,C=144,H=56,W=56,R=3,S=3,stride=2,pad=1",
    "depthwise_conv2d:N=1,C=192,H=28,W=28,R=3,S=3,pad=1",
    "depthwise_conv2d:N=1,C=192,H=28,W=28,R=3,S=3,stride=2,pad=1",
    "depthwise_conv2d:N=1,C=384,H=14,W=14,R=3,S=3,pad=1",
    "depthwise_conv2d:N=1,C=576,H=14,W=14,R=3,S=3,pad=1",
    "depthwise_conv2d:N=1,C=576,H=14,W=14,R=3,S=3,stride=2,pad=1",
    "depthwise_conv2d:N=1,C=960,H=7,W=7,R=3,S=3,pad=1",
]
GEMMS = [
    "dense:M=1024,N=1024,K=1024",
    "dense:M=1,N=1000,K=512",
    "batch_matmul:B=12,M=128,N=128,K=64",
]
ALL = GEMMS + RESNET18_CONVS + MOBILENET_V2_DEPTHWISE
