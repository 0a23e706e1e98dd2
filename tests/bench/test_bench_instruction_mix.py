"""bench/instruction_mix.py finds the innermost arithmetic loop of a disassembly."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import instruction_mix

DISASSEMBLY = """
  10:	mov    %rdi,%rax
  14:	vpbroadcastd (%rsi),%zmm16
  1a:	vpdpbusd %zmm1,%zmm16,%zmm0
  20:	vpdpbusd %zmm2,%zmm16,%zmm3
  26:	add    $0x4,%rsi
  2a:	jne    14 <k+0x4>
  30:	vmovdqu64 %zmm0,(%rdx)
  36:	vpdpbusd %zmm1,%zmm16,%zmm0
  3c:	jne    10 <k>
  40:	jmp    50 <k+0x40>
"""


def test_the_smallest_loop_with_the_most_arithmetic_wins() -> None:
    # the outer loop (10..3c) has more instructions and more vpdpbusd; the inner one has two
    # of them in five: the outer has three, so it wins on work, not on size
    assert instruction_mix.hot_loop(DISASSEMBLY).count("vpdpbusd") == 3
    inner_only = DISASSEMBLY.replace("  36:\tvpdpbusd %zmm1,%zmm16,%zmm0\n", "")
    assert instruction_mix.hot_loop(inner_only) == [
        "vpbroadcastd", "vpdpbusd", "vpdpbusd", "add", "jne"]


def test_no_backward_branch_means_no_loop() -> None:
    assert instruction_mix.hot_loop("  10:\tjmp    50 <k+0x40>\n") == []
