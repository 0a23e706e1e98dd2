"""Code generators from the loop-nest IR: LLVM IR for CPUs, CUDA C for NVIDIA GPUs."""
