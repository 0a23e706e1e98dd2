"""The normalised device class a measurement was taken on, and how classes relate.

A best config is only best on the hardware it was measured on. Two workers belong to the same
class when they would time a kernel alike: same kind (cpu/gpu), vendor, microarchitecture, ISA
level, model and core count. The thread count a measurement used is kept beside the class (it
is a property of the run, not of the machine).

The class is written as one string id, ``kind:vendor:microarch:isa_level:model:cores``
(``cpu:amd:zen4:x86-64-v4:amd-epyc-9r14:2c``; for a GPU ``gpu:nvidia:sm_90:sm_9x:nvidia-h100-
80gb-hbm3:80g``), so it can be a key column and a CLI argument; ``DeviceClass.parse`` reads it
back. Lookups fall back from the exact class to the same microarchitecture, then to the same
ISA level (see ``tuner_service.jobs.device``).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

#: the class of records that predate device classes (their hardware is not known)
UNKNOWN = "unknown"
_FIELDS = 6
_SLUG = re.compile(r"[^a-z0-9_.+]+")
_NOISE_WORDS = re.compile(r"\((r|tm|c)\)|\b(cpu|processor|\d+-core)\b|@.*$", re.IGNORECASE)

#: AMD family -> [(first model, last model, microarchitecture)]
_AMD = {
    0x17: [(0x00, 0x2F, "zen1"), (0x30, 0xFF, "zen2")],
    0x19: [(0x00, 0x0F, "zen3"), (0x10, 0x1F, "zen4"), (0x20, 0x5F, "zen3"),
           (0x60, 0xAF, "zen4")],
    0x1A: [(0x00, 0xFF, "zen5")],
}
#: Intel family 6 model -> microarchitecture (server and recent client parts)
_INTEL = {
    0x4E: "skylake", 0x5E: "skylake", 0x8E: "skylake", 0x9E: "skylake",
    0x55: "skylake-avx512", 0x6A: "icelake-server", 0x6C: "icelake-server",
    0x7D: "icelake", 0x7E: "icelake", 0x8C: "tigerlake", 0x8D: "tigerlake",
    0x8F: "sapphirerapids", 0xCF: "emeraldrapids", 0xAD: "graniterapids",
    0xAE: "graniterapids", 0x97: "alderlake", 0x9A: "alderlake", 0xB7: "raptorlake",
    0xBA: "raptorlake", 0xBF: "raptorlake", 0xAA: "meteorlake", 0xC6: "arrowlake",
}
#: Arm (implementer 0x41) part -> microarchitecture
_ARM = {0xD0C: "neoverse-n1", 0xD40: "neoverse-v1", 0xD49: "neoverse-n2",
        0xD4F: "neoverse-v2", 0xD8E: "neoverse-n3", 0xD84: "neoverse-v3"}
#: x86-64 micro-architecture levels (psABI), highest first, by the flags each needs; AMX
#: (whose tiles the kernel exposes only where it saves their state) is a level of its own: a
#: dense or convolution config there lowers to tile instructions, not to the vector kernel
_V4 = ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
_X86_LEVELS = (
    ("x86-64-v4-amx", (*_V4, "amx_tile", "amx_int8", "amx_bf16")),
    ("x86-64-v4", _V4),
    ("x86-64-v3", ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe")),
    ("x86-64-v2", ("cx16", "popcnt", "sse4_1", "sse4_2", "ssse3")),
)


class DeviceClassError(ValueError):
    """A device class id that cannot be read."""


@dataclasses.dataclass(frozen=True)
class DeviceClass:
    kind: str  # "cpu" or "gpu"
    vendor: str
    microarch: str
    isa_level: str
    model: str
    cores: str  # "2c" (physical cores) for a CPU, "80g" (memory) for a GPU

    @property
    def id(self) -> str:
        fields = dataclasses.astuple(self)
        return UNKNOWN if all(f == UNKNOWN for f in fields) else ":".join(fields)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, **dataclasses.asdict(self)}

    @classmethod
    def parse(cls, text: str) -> DeviceClass:
        """Read an id back; ``unknown`` parses as a class whose every field is unknown."""
        if text == UNKNOWN:
            return cls(*(UNKNOWN,) * _FIELDS)
        parts = text.split(":")
        if len(parts) != _FIELDS or not all(parts) or any(_slug(p) != p for p in parts):
            raise DeviceClassError(
                f"device class {text!r} is not kind:vendor:microarch:isa_level:model:cores "
                "(lower-case words, e.g. cpu:amd:zen4:x86-64-v4:amd-epyc-9r14:2c)")
        return cls(*parts)


def cpu_device_class(cpuinfo: dict[str, str], flags: set[str], physical_cores: int,
                     machine: str) -> DeviceClass:
    """The class of a CPU from its /proc/cpuinfo fields (first processor) and flags."""
    vendor = _cpu_vendor(cpuinfo, machine)
    model = _normalise_model(cpuinfo.get("model name") or machine or UNKNOWN)
    return DeviceClass("cpu", vendor, _cpu_microarch(vendor, cpuinfo), isa_level(flags, machine),
                       model, f"{max(1, physical_cores)}c")


def gpu_device_class(gpu: dict[str, Any]) -> DeviceClass:
    """The class of a GPU from the facts a GPU backend reports (name, compute capability)."""
    arch = _slug(str(gpu.get("compute_capability") or UNKNOWN))
    # same major compute capability: the same instruction set family (sm_90 and sm_90a...)
    match = re.fullmatch(r"sm_(\d+?)(\d)[a-z]?", arch)
    level = f"sm_{match.group(1)}x" if match else arch
    memory = gpu.get("memory_bytes")
    size = f"{round(int(memory) / 2**30)}g" if isinstance(memory, int) and memory > 0 else UNKNOWN
    name = _normalise_model(str(gpu.get("name") or UNKNOWN))
    return DeviceClass("gpu", name.split("-")[0] or UNKNOWN, arch, level, name, size)


def isa_level(flags: set[str], machine: str = "x86_64") -> str:
    if machine in ("aarch64", "arm64") or "asimd" in flags:
        if "sve2" in flags:
            return "armv9-sve2"
        return "armv8-sve" if "sve" in flags else "armv8"
    for level, needed in _X86_LEVELS:
        if all(f in flags for f in needed):
            return level
    return "x86-64" if flags else UNKNOWN


def read_cpuinfo(proc: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The first processor's fields."""
    try:
        text = proc.read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def _cpu_vendor(cpuinfo: dict[str, str], machine: str) -> str:
    vendor_id = cpuinfo.get("vendor_id", "")
    if vendor_id == "AuthenticAMD":
        return "amd"
    if vendor_id == "GenuineIntel":
        return "intel"
    implementer = cpuinfo.get("CPU implementer", "")
    if implementer:
        return {"0x41": "arm", "0x61": "apple", "0xc0": "ampere"}.get(implementer.lower(),
                                                                       "arm")
    return _slug(vendor_id) or _slug(machine) or UNKNOWN


def _cpu_microarch(vendor: str, cpuinfo: dict[str, str]) -> str:
    family, model = _int(cpuinfo.get("cpu family")), _int(cpuinfo.get("model"))
    if vendor == "amd" and family is not None and model is not None:
        for low, high, name in _AMD.get(family, []):
            if low <= model <= high:
                return name
    if vendor == "intel" and family == 6 and model is not None and model in _INTEL:
        return _INTEL[model]
    part = _int(cpuinfo.get("CPU part"))
    if part is not None:
        return _ARM.get(part, f"{vendor}-part{part:x}")
    if family is not None and model is not None:
        return f"{vendor}-f{family:x}-m{model:x}"
    return UNKNOWN


def _normalise_model(name: str) -> str:
    return _slug(_NOISE_WORDS.sub(" ", name)) or UNKNOWN


def _slug(text: str) -> str:
    return _SLUG.sub("-", text.strip().lower()).strip("-")


def _int(text: str | None) -> int | None:
    if not text:
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None
