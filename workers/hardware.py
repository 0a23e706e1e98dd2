"""Facts about this machine and its software, reported at registration.

Everything is read from /proc and /sys (Linux) with safe fallbacks elsewhere; nothing runs at
import time and nothing heavy is imported (versions come from package metadata). A GPU's facts
come from its backend (``workers.backends.accelerator_facts``): the backends build on this
module, never the other way round.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from pathlib import Path
from typing import Any

from workers.device_class import (
    DeviceClass,
    cpu_device_class,
    gpu_device_class,
    read_cpuinfo,
)

#: widest vector unit implied by a CPU flag, widest first
_VECTOR_FLAGS = (("avx512f", 512), ("avx2", 256), ("avx", 256), ("sse2", 128), ("asimd", 128),
                 ("neon", 128))
#: flags worth showing on a dashboard (the full list is long)
_NOTABLE_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl",
                  "avx512_vnni", "avx512_bf16", "amx_tile", "asimd", "sve")
#: what a last-level cache is assumed to be when /sys does not say
DEFAULT_LLC_BYTES = 32 << 20
_SOFTWARE = ("numpy", "llvmlite", "httpx", "pycuda", "tuner")


def cpu_facts(proc: Path = Path("/proc/cpuinfo"),
              sys_cpu: Path = Path("/sys/devices/system/cpu")) -> dict[str, Any]:
    info = read_cpuinfo(proc)
    flags = set(info.get("flags", info.get("Features", "")).split())
    return {
        "cpu_model": info.get("model name") or platform.processor() or platform.machine(),
        "logical_cores": os.cpu_count() or 1,
        "physical_cores": _physical_cores(proc) or os.cpu_count() or 1,
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "vector_bits": vector_bits(flags),
        "flags": sorted(flags & set(_NOTABLE_FLAGS)),
        "caches": caches(sys_cpu / "cpu0" / "cache"),
        "memory_bytes": _memory_bytes(),
        "machine": platform.machine(),
        "os": platform.platform(),
    }


def vector_bits(flags: set[str]) -> int:
    for flag, bits in _VECTOR_FLAGS:
        if flag in flags:
            return bits
    return 0


def caches(cache_dir: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> list[dict[str, Any]]:
    out = []
    for index in sorted(cache_dir.glob("index*")):
        size = _parse_size(_read(index / "size"))
        level = _read(index / "level")
        if size is None or not level.isdigit():
            continue
        out.append({
            "level": int(level),
            "type": _read(index / "type").lower() or "unified",
            "size_bytes": size,
            "line_bytes": int(_read(index / "coherency_line_size") or 0),
            "shared_cpus": _read(index / "shared_cpu_list"),
        })
    return out


def llc_bytes(cache_dir: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """Size of the last-level data cache, for sizing a cache flush."""
    data = [c for c in caches(cache_dir) if c["type"] in ("data", "unified")]
    if not data:
        return DEFAULT_LLC_BYTES
    return int(max(data, key=lambda c: (c["level"], c["size_bytes"]))["size_bytes"])


def device_class(hardware: dict[str, Any], declared: str | None = None,
                 proc: Path = Path("/proc/cpuinfo")) -> DeviceClass:
    """The normalised class this worker measures on: what the backend declares (the fake
    backend simulates other hardware), else the GPU in ``hardware``, else this CPU."""
    if declared:
        return DeviceClass.parse(declared)
    gpu = hardware.get("gpu")
    if isinstance(gpu, dict):
        return gpu_device_class(gpu)
    info = read_cpuinfo(proc)
    flags = set(info.get("flags", info.get("Features", "")).split())
    return cpu_device_class(info, flags, _physical_cores(proc) or os.cpu_count() or 1,
                            platform.machine())


def software_versions(names: tuple[str, ...] = _SOFTWARE) -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _physical_cores(proc: Path) -> int:
    cores = set()
    physical = core = ""
    for line in _read(proc).splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "physical id":
            physical = value.strip()
        elif key == "core id":
            core = value.strip()
            cores.add((physical, core))
    return len(cores)


def _parse_size(text: str) -> int | None:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if not text:
        return None
    scale = units.get(text[-1], 1)
    digits = text[:-1] if text[-1] in units else text
    return int(digits) * scale if digits.isdigit() else None


def _memory_bytes() -> int | None:
    for line in _read(Path("/proc/meminfo")).splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * 1024
    return None
