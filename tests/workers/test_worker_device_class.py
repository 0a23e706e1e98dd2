"""Device classes: normalised from /proc/cpuinfo or GPU facts, written as one id, read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.backends import backend_class
from workers.device_class import (
    UNKNOWN,
    DeviceClass,
    DeviceClassError,
    cpu_device_class,
    gpu_device_class,
    isa_level,
    read_cpuinfo,
)
from workers.hardware import device_class

V4 = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx", "avx2", "bmi1", "bmi2",
      "f16c", "fma", "movbe", "cx16", "popcnt", "sse4_1", "sse4_2", "ssse3"}
V3 = V4 - {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


@pytest.mark.parametrize(("fields", "flags", "expected"), [
    ({"vendor_id": "AuthenticAMD", "cpu family": "25", "model": "17",
      "model name": "AMD EPYC 9R14 96-Core Processor"}, V4,
     "cpu:amd:zen4:x86-64-v4:amd-epyc-9r14:2c"),
    ({"vendor_id": "AuthenticAMD", "cpu family": "26", "model": "2",
      "model name": "AMD EPYC 9R45 Processor"}, V4, "cpu:amd:zen5:x86-64-v4:amd-epyc-9r45:2c"),
    ({"vendor_id": "AuthenticAMD", "cpu family": "25", "model": "1",
      "model name": "AMD EPYC 7R13 Processor"}, V3, "cpu:amd:zen3:x86-64-v3:amd-epyc-7r13:2c"),
    ({"vendor_id": "GenuineIntel", "cpu family": "6", "model": "143",
      "model name": "Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz"}, V4,
     "cpu:intel:sapphirerapids:x86-64-v4:intel-xeon-platinum-8480+:2c"),
    ({"CPU implementer": "0x41", "CPU part": "0xd40"}, {"asimd", "sve"},
     "cpu:arm:neoverse-v1:armv8-sve:aarch64:2c"),
    ({"vendor_id": "GenuineIntel", "cpu family": "6", "model": "250",
      "model name": "Intel Future CPU"}, V3, "cpu:intel:intel-f6-mfa:x86-64-v3:intel-future:2c"),
])
def test_cpu_classes_are_normalised(fields: dict[str, str], flags: set[str],
                                    expected: str) -> None:
    machine = "aarch64" if "CPU part" in fields else "x86_64"
    found = cpu_device_class(fields, flags, 2, machine)
    assert found.id == expected
    assert DeviceClass.parse(found.id) == found


def test_isa_levels() -> None:
    assert isa_level(V4) == "x86-64-v4"
    assert isa_level(V4 | {"amx_tile", "amx_int8", "amx_bf16"}) == "x86-64-v4-amx"
    assert isa_level(V4 | {"amx_tile"}) == "x86-64-v4"  # tiles without the int8/bf16 units
    assert isa_level(V3) == "x86-64-v3"
    assert isa_level({"sse2"}) == "x86-64"
    assert isa_level({"asimd", "sve", "sve2"}, "aarch64") == "armv9-sve2"


def test_gpu_class_from_backend_facts() -> None:
    found = gpu_device_class({"name": "NVIDIA H100 80GB HBM3", "compute_capability": "sm_90",
                              "memory_bytes": 85_520_809_984})
    assert found.id == "gpu:nvidia:sm_90:sm_9x:nvidia-h100-80gb-hbm3:80g"
    assert device_class({"gpu": {"name": "NVIDIA A100-SXM4-40GB",
                                 "compute_capability": "sm_80"}}).isa_level == "sm_8x"


def test_this_machine_has_a_class(tmp_path: Path) -> None:
    here = device_class({})
    assert here.kind == "cpu" and DeviceClass.parse(here.id) == here
    fake = tmp_path / "cpuinfo"
    fake.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
                    "model name\t: AMD EPYC 9R45\nflags\t\t: " + " ".join(sorted(V4)) +
                    "\ncore id\t\t: 0\n\nprocessor\t: 1\n")
    assert read_cpuinfo(fake)["cpu family"] == "26"
    assert device_class({}, proc=fake).microarch == "zen5"


def test_a_backend_may_declare_the_class_it_simulates() -> None:
    fake = backend_class("fake")
    assert fake.declared_device_class({"device_class": "cpu:amd:zen5:x86-64-v4:m:2c"}) \
        == "cpu:amd:zen5:x86-64-v4:m:2c"
    assert fake.declared_device_class({}).startswith("cpu:fake:")  # never the host's class
    assert backend_class("llvm").declared_device_class({}) is None
    assert device_class({}, declared="cpu:amd:zen5:x86-64-v4:m:2c").microarch == "zen5"


@pytest.mark.parametrize("text", ["", "cpu:amd", "cpu:amd:zen4:x86-64-v4:EPYC:2c",
                                  "cpu:amd:zen4:x86-64-v4:a b:2c", "a:b:c:d:e:f:g"])
def test_bad_class_ids_are_refused(text: str) -> None:
    with pytest.raises(DeviceClassError, match="kind:vendor:microarch"):
        DeviceClass.parse(text)


def test_unknown_round_trips() -> None:
    assert DeviceClass.parse(UNKNOWN).id == UNKNOWN
