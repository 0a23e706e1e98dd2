"""Helpers for the CUDA tests: compile generated kernels with nvcc (no GPU needed)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

ARCH = "sm_90"
#: nvcc processes run at once (the CI machines have 2 cores)
PARALLEL = 2

Compile = Callable[[Sequence[tuple[str, str]]], None]


def nvcc_path() -> str | None:
    return shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)


@pytest.fixture
def nvcc_compile(tmp_path: Path) -> Compile:
    """``compile([(label, source), ...])``: build every source into cubins for sm_90, spread
    over a few nvcc processes, and fail the test with nvcc's messages (labelled) on error."""
    nvcc = nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc is not installed: generated CUDA C cannot be compile-checked")

    def compile_all(kernels: Sequence[tuple[str, str]]) -> None:
        groups = [list(kernels[i::PARALLEL]) for i in range(PARALLEL)]
        procs = []
        for n, group in enumerate(g for g in groups if g):
            src = tmp_path / f"batch{n}.cu"
            src.write_text("".join(f"// ---- {label}\n{text}\n" for label, text in group))
            procs.append((src, subprocess.Popen(
                [nvcc, "-cubin", f"-arch={ARCH}", "-o", str(src.with_suffix(".cubin")),
                 str(src)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        failures = []
        for src, proc in procs:
            output, _ = proc.communicate()
            if proc.returncode != 0:
                failures.append(f"{src.name}: nvcc exited {proc.returncode}\n"
                                f"{_label_errors(src, output)}")
            elif "warning" in output:
                failures.append(f"{src.name}: nvcc warned\n{_label_errors(src, output)}")
        assert not failures, "\n".join(failures)

    return compile_all


def _label_errors(src: Path, output: str) -> str:
    """nvcc's output with the label of the kernel each message's line belongs to."""
    lines = src.read_text().splitlines()
    labels: list[str] = []
    current = ""
    for line in lines:
        if line.startswith("// ---- "):
            current = line[len("// ---- "):]
        labels.append(current)
    out = []
    for message in output.splitlines()[:40]:
        marker = f"{src.name}("
        if marker in message:
            try:
                number = int(message.split(marker, 1)[1].split(")", 1)[0])
                message = f"[{labels[number - 1]}] {message}"
            except (ValueError, IndexError):
                pass
        out.append(message)
    return "\n".join(out)
