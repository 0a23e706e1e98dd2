"""Shared by the int8 kernel tests: the ``instruction`` fixture runs a test with the host's int8
instruction, on an AMX host again with the tiles switched off (the VNNI vector kernels), and on
a VNNI host again as a host without VNNI (vpmaddwd, or vpmaddubsw for narrow weights), so every
path is covered wherever its host exists."""

import pytest

from schedule_templates.codegen.llvm_jit import host_features
from schedule_templates.templates import x86_amx_gemm, x86_dot_gemm

HAS_VNNI = "+avx512vnni" in host_features().split(",")
HAS_AMX = x86_amx_gemm.host_amx("tdpbusd")
INSTRUCTIONS = ["host", *(["vnni"] if HAS_AMX else []), *(["pmaddwd"] if HAS_VNNI else [])]


@pytest.fixture(params=INSTRUCTIONS)
def instruction(request, monkeypatch):
    """The int8 instruction the templates lower to: the host's, VNNI without tiles, or
    those of a host without VNNI forced (the fixture's value is for full-range weights)."""
    if request.param == "vnni":
        monkeypatch.setattr(x86_amx_gemm, "host_amx", lambda dot="tdpbusd": False)
    if request.param == "pmaddwd":
        monkeypatch.setattr(x86_dot_gemm, "int8_instruction", lambda narrow=False: (
            x86_dot_gemm.PMADDUBSW if narrow else x86_dot_gemm.PMADDWD))
    return x86_dot_gemm.int8_instruction()
