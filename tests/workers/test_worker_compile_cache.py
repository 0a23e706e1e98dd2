"""The compile cache: an LRU bounded by entries and bytes, and the llvm backend's use of it."""

from __future__ import annotations

import dataclasses

import pytest

from workers.compile_cache import CompileCache, CompileKey


def key(i: int, cpu: str = "cpu") -> CompileKey:
    return CompileKey("dense.x86", 1, "dense:M=64,N=64,K=64", f'{{"index":{i}}}', "llvm", cpu)


def test_least_recently_used_entries_go_first() -> None:
    cache = CompileCache(max_entries=2, max_bytes=1000)
    cache.put(key(1), b"a")
    cache.put(key(2), b"b")
    assert cache.get(key(1)) == b"a"  # 1 is now the most recent
    cache.put(key(3), b"c")
    assert cache.get(key(2)) is None and cache.get(key(1)) == b"a" and len(cache) == 2
    assert (cache.hits, cache.misses) == (2, 1)


def test_the_byte_budget_evicts_and_oversized_code_is_not_kept() -> None:
    cache = CompileCache(max_entries=10, max_bytes=10)
    cache.put(key(1), b"x" * 6)
    cache.put(key(2), b"y" * 6)
    assert cache.get(key(1)) is None and cache.size_bytes == 6
    cache.put(key(3), b"z" * 11)
    assert cache.get(key(3)) is None and cache.size_bytes == 6
    cache.put(key(2), b"w" * 2)  # replacing an entry counts its new size only
    assert cache.size_bytes == 2


def test_keys_differ_by_every_part() -> None:
    cache = CompileCache()
    cache.put(key(1), b"a")
    assert cache.get(key(1, cpu="other")) is None and cache.get(None) is None
    assert CompileKey.canonical_config({"b": 1, "a": 2}) == '{"a":2,"b":1}'


def test_bounds_must_not_be_negative() -> None:
    with pytest.raises(ValueError):
        CompileCache(max_entries=-1)


def test_llvm_keys_name_the_template_version_and_the_host_cpu() -> None:
    pytest.importorskip("llvmlite")
    from schedule_templates.protocol import Candidate, ClaimItem, Target
    from workers.backends.llvm import LlvmBackend, host_cpu_id

    candidate = Candidate("dense.x86", "dense:M=64,N=64,K=64", {"index": 3}, 1)
    task = ClaimItem(1, candidate, Target("llvm"))
    found = LlvmBackend.cache_key(task, {})
    assert found is not None and found.template_version == 1 and found.cpu == host_cpu_id()
    assert LlvmBackend.cache_key(task, {}) == found
    for changed in ({"template_version": 99}, {"template": "nope"}):
        other = dataclasses.replace(task, candidate=dataclasses.replace(candidate, **changed))
        assert LlvmBackend.cache_key(other, {}) is None
