"""Hardware facts from /proc and /sys, read from fixtures."""

from __future__ import annotations

from pathlib import Path

from workers.hardware import caches, cpu_facts, llc_bytes, software_versions, vector_bits

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9B45
physical id\t: 0
core id\t: 0
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw

processor\t: 1
model name\t: AMD EPYC 9B45
physical id\t: 0
core id\t: 1
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw
"""


def fake_sys(root: Path) -> Path:
    for index, (level, kind, size) in enumerate(
            [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"),
             (3, "Unified", "32768K")]):
        d = root / "cpu0" / "cache" / f"index{index}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
        (d / "coherency_line_size").write_text("64\n")
        (d / "shared_cpu_list").write_text("0-1\n")
    return root


def test_cpu_facts_from_fixtures(tmp_path: Path) -> None:
    proc = tmp_path / "cpuinfo"
    proc.write_text(CPUINFO)
    facts = cpu_facts(proc, fake_sys(tmp_path / "sys"))
    assert facts["cpu_model"] == "AMD EPYC 9B45"
    assert facts["physical_cores"] == 2
    assert facts["vector_bits"] == 512
    assert {"avx512f", "fma"} <= set(facts["flags"])
    assert [c["size_bytes"] for c in facts["caches"]] == [48 << 10, 32 << 10, 1 << 20, 32 << 20]


def test_llc_and_vector_width(tmp_path: Path) -> None:
    root = fake_sys(tmp_path)
    assert llc_bytes(root / "cpu0" / "cache") == 32 << 20
    assert llc_bytes(tmp_path / "missing") > 0
    assert caches(tmp_path / "missing") == []
    assert vector_bits({"sse2", "avx2"}) == 256 and vector_bits({"asimd"}) == 128
    assert vector_bits(set()) == 0


def test_this_machine_and_its_software() -> None:
    facts = cpu_facts()
    assert facts["logical_cores"] >= 1 and facts["cpu_model"]
    versions = software_versions()
    assert {"python", "numpy"} <= set(versions)
