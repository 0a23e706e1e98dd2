"""The vector instructions of a kernel's hot loop, from its compiled object code.

    python bench/instruction_mix.py KEY [--config INDEX] [--object out.o]

Compiles the template's default config (or ``--config``) for this host, disassembles the object
with ``objdump`` and prints the instruction counts of the innermost loop that does the arithmetic:
the loop (a backward branch's range) holding the most dot-product or FMA instructions, the
smallest such when several tie. Shows whether a kernel really runs on ``vpdpbusd`` (VNNI),
``vpmaddwd`` (the int8 path of AVX2 hosts), ``vpmulld`` (int8 depthwise),
``vdpbf16ps`` (AVX-512 BF16) or ``vfmadd`` (fp32), and what else the loop spends issue slots on.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from schedule_templates.codegen.llvm_ir import generate_llvm_ir
from schedule_templates.codegen.llvm_jit import emit_object
from schedule_templates.templates.base import get_template
from schedule_templates.workloads import parse_workload

ARITHMETIC = ("vpdpbusd", "vpmaddwd", "vpmulld", "vdpbf16ps", "vfmadd")
_LINE = re.compile(r"\s+([0-9a-f]+):\s+(\S+)\s*(.*)")
_TARGET = re.compile(r"([0-9a-f]+) <")


def hot_loop(disassembly: str) -> list[str]:
    """Mnemonics of the innermost arithmetic loop of ``objdump -d --no-show-raw-insn`` text."""
    code = [(int(m.group(1), 16), m.group(2), m.group(3))
            for m in map(_LINE.match, disassembly.splitlines()) if m]
    best: tuple[int, list[str]] | None = None
    for addr, op, arg in code:
        target = _TARGET.match(arg)
        if not op.startswith("j") or target is None or int(target.group(1), 16) >= addr:
            continue
        start = int(target.group(1), 16)
        body = [o for a, o, _ in code if start <= a <= addr]
        work = sum(o.startswith(ARITHMETIC) for o in body)
        if best is None or (work, -len(body)) > (best[0], -len(best[1])):
            best = (work, body)
    return best[1] if best else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("key", help="workload key, e.g. dense_int8:M=1024,N=1024,K=1024")
    parser.add_argument("--config", type=int, help="config index (default: the template's)")
    parser.add_argument("--object", type=Path, help="also keep the object file here")
    args = parser.parse_args()
    if shutil.which("objdump") is None:
        sys.exit("objdump not found: install binutils")
    workload = parse_workload(args.key)
    template = get_template(workload.op)
    space = template.space(workload)
    config = template.default_config(workload) if args.config is None else space.get(args.config)
    code = emit_object(generate_llvm_ir(template.lower(workload, config)))
    with tempfile.TemporaryDirectory() as tmp:
        path = args.object or Path(tmp) / "kernel.o"
        path.write_bytes(code)
        text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)],
                              capture_output=True, text=True, check=True).stdout
    loop = hot_loop(text)
    print(json.dumps({"workload": workload.key, "template": template.name,
                      "config": config.index, "hot_loop_instructions": len(loop),
                      "mix": dict(collections.Counter(loop).most_common())}))


if __name__ == "__main__":
    main()
