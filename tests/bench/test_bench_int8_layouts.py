"""``bench/int8_layouts.py``: NCHW against channels-last int8 convolutions in one process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import int8_layouts


def test_rows_time_every_layout_the_shape_admits_and_check_their_bytes() -> None:
    report = int8_layouts.measure(
        ["conv2d_int8:N=1,C=8,H=6,W=5,K=16,R=3,S=3,pad=1,bias=s32",
         "conv2d_int8:N=1,C=3,H=9,W=8,K=32,R=3,S=3,stride=2,pad=1",
         "conv2d_int8:N=1,C=8,H=5,W=5,K=16,R=1,S=1,residual=u8",
         "conv2d_int8:N=1,C=8,H=5,W=5,K=12,R=1,S=1"], threads=1, rounds=1)
    padded, stem, shortcut, narrow = report["rows"]
    assert {"nchw_ms", "out_nhwc_ms", "nhwc_ms"} <= set(padded)
    assert padded["nhwc_exact"] and padded["out_nhwc_exact"] and padded["nchw_exact"]
    assert "nhwc_ms" not in stem and stem["out_nhwc_exact"]  # 3 channels: no word input
    assert shortcut["nhwc_exact"] and shortcut["nhwc_vs_nchw"] > 0
    assert set(narrow) == {"key", "nchw_ms", "nchw_exact"}  # K=12: not whole registers


def test_a_key_already_laid_out_is_refused() -> None:
    with pytest.raises(SystemExit, match="not an NCHW conv2d_int8"):
        int8_layouts.layouts("conv2d_int8:N=1,C=8,H=5,W=5,K=16,R=1,S=1,in_layout=nhwc")
