"""``bench/amx.py``: tiles against the vector kernels in one process, outputs compared."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import amx

from schedule_templates.templates import x86_amx_gemm


@pytest.mark.skipif(not x86_amx_gemm.host_amx("tdpbf16ps"),
                    reason="this host (CPU or kernel) grants no AMX tiles")
def test_rows_time_both_kernels_and_compare_their_outputs() -> None:
    report = amx.measure(["dense_int8:M=32,N=64,K=128,bias=s32",
                          "conv2d_bf16:N=1,C=32,H=8,W=8,K=32,R=3,S=3,pad=1",
                          "dense:M=32,N=64,K=128"], threads=1, rounds=1)
    int8, bf16, fp32 = report["rows"]
    assert int8["same_bytes"] is True and int8["tiles_ms"] > 0 and int8["vector_ms"] > 0
    assert bf16["max_rel_diff"] < 1e-3 and bf16["tiles_speedup"] > 0
    assert "fp32_ms" in fp32 and "tiles_ms" not in fp32
    assert x86_amx_gemm.host_amx("tdpbusd")  # the switch is put back
