"""Shared by the int8 kernel tests: the ``instruction`` fixture runs a test with the host's int8
instruction and, on a VNNI host, again forced onto vpmaddwd, so both paths are covered wherever
VNNI exists."""

import pytest

from schedule_templates.codegen.llvm_jit import host_features
from schedule_templates.templates import x86_dot_gemm

HAS_VNNI = "+avx512vnni" in host_features().split(",")
INSTRUCTIONS = ["host", "pmaddwd"] if HAS_VNNI else ["host"]


@pytest.fixture(params=INSTRUCTIONS)
def instruction(request, monkeypatch):
    """The int8 instruction the templates lower to: the host's, or vpmaddwd forced."""
    if request.param == "pmaddwd":
        monkeypatch.setattr(x86_dot_gemm, "int8_instruction", lambda: x86_dot_gemm.PMADDWD)
    return x86_dot_gemm.int8_instruction()
