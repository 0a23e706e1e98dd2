"""Compile the native runtime (``native_runtime.c``) that every model library links.

It is plain C99 plus ``dladdr``/``dlsym`` (the standalone loader looks the kernels up by symbol
in its own library), built with the same compiler driver that links the library, so a build
needs nothing beyond what linking already needed.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tuner_service.compiler.deploy.errors import BuildError

RUNTIME_SOURCE = Path(__file__).with_name("native_runtime.c")
#: libraries the runtime object needs at link time
RUNTIME_LIBS = ("-ldl",)


def compile_runtime(compiler: str, directory: Path) -> Path:
    """``native_runtime.o`` in ``directory``, position-independent, for linking."""
    target = directory / "native_runtime.o"
    command = [compiler, "-std=c11", "-O2", "-fPIC", "-c", str(RUNTIME_SOURCE), "-o", str(target)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BuildError(f"compiling the native runtime failed: {done.stderr.strip()[-2000:]}")
    return target
