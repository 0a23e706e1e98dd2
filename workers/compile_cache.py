"""Compiled candidates kept by the worker, so a config measured again is not built again.

The server measures a task's best configs again before it trusts them, and a worker often
gets the same (workload, config) back after a lease lapsed: building is most of a candidate's
cost on a CPU (hundreds of milliseconds of code generation and LLVM), loading the object code
a few. The cache lives in the worker's main process, not in a measuring child, so it survives
the children being replaced and serves every child. It is an LRU bounded both by entries and
by bytes; a key names everything the code depends on (``CompileKey``), so a hit is safe to run.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from typing import Any

#: defaults: ResNet-18 object code is about 10-40 KiB per candidate
DEFAULT_MAX_ENTRIES = 2048
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class CompileKey:
    """What a candidate's object code depends on."""

    template: str
    template_version: int
    workload: str
    config: str  # the config as canonical JSON (its index, or its knob values)
    target: str
    cpu: str  # the host CPU's name and code-generation features

    @staticmethod
    def canonical_config(config: dict[str, Any]) -> str:
        return json.dumps(config, sort_keys=True, separators=(",", ":"))


class CompileCache:
    """Object code by ``CompileKey``; least recently used entries go first."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_entries < 0 or max_bytes < 0:
            raise ValueError("compile cache bounds must not be negative")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[CompileKey, bytes] = collections.OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def get(self, key: CompileKey | None) -> bytes | None:
        if key is None:
            return None
        code = self._entries.get(key)
        if code is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return code

    def put(self, key: CompileKey, code: bytes) -> None:
        """Keep ``code``; an entry larger than the whole byte budget is not kept."""
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= len(old)
        if len(code) > self.max_bytes or self.max_entries == 0:
            return
        self._entries[key] = code
        self._bytes += len(code)
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            _key, evicted = self._entries.popitem(last=False)
            self._bytes -= len(evicted)
