"""Best tuned config per workload, read from a file or from the server's shared tuning log.

Accepted inputs (whatever the service hands out):
- ``tuner fetch JOB`` JSON: ``{"tasks": [{"workload", "template", "template_version",
  "config", "best_latency_s"}, ...]}``;
- the shared tuning log (``GET /api/v1/tuning-log``): a list of ``{"workload", "target",
  "template", "template_version", "config", "mean_cost"}``;
- JSON lines: measurement records (``GET /api/v1/records``) or AutoTVM-style lines
  (``tuner fetch --format autotvm``); the fastest good result per workload wins.

A config tuned for a workload serves every fused variant of the same base operator
(``...,epilogue=...`` keys share the base workload's space): the exact key wins, then the base
key, then the fastest sibling variant. The thread count the configs were measured at (a
``threads`` field on the document or on an entry) travels with them: ``tuner build`` records it
and makes it the library's default.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from schedule_templates.errors import ScheduleError
from schedule_templates.protocol import Target
from schedule_templates.records import ErrorKind
from schedule_templates.space import Config
from schedule_templates.templates.base import Template
from schedule_templates.workloads import Workload, parse_workload
from tuner_service.compiler.deploy.errors import ConfigSourceError

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TunedEntry:
    workload: str  # canonical key
    template: str
    template_version: int | None  # None: the source did not say
    config: Any  # config JSON as the space reads it
    mean_cost: float  # seconds; inf when unknown
    target: str = ""
    threads: int | None = None  # thread count it was measured at; None: the source did not say


@dataclasses.dataclass(frozen=True)
class Choice:
    """The config a layer is built with and where it came from."""

    config: Config
    source: str  # "tuned" or "default"
    tuned_key: str | None  # the workload key whose record was used (may be a base key)
    mean_cost: float | None
    threads: int | None = None  # thread count the config was tuned at, if known


class ConfigBook:
    """Tuned configs by canonical workload key, best (lowest cost) first."""

    def __init__(self, entries: Iterable[TunedEntry] = (), target: str = "llvm",
                 threads: int | None = None) -> None:
        self.target = target
        self._threads = threads  # the document's own thread count, if it names one
        self._best: dict[str, TunedEntry] = {}
        self._variants: dict[str, set[str]] = {}  # base key -> keys of its tuned variants
        for entry in entries:
            self.add(entry)

    def __len__(self) -> int:
        return len(self._best)

    def add(self, entry: TunedEntry) -> None:
        if entry.target and Target.parse(entry.target).kind != Target.parse(self.target).kind:
            return
        known = self._best.get(entry.workload)
        if known is None or entry.mean_cost < known.mean_cost:
            self._best[entry.workload] = entry
        try:
            base = str(parse_workload(entry.workload).base_key)
        except ScheduleError:
            return  # keys from files are checked when read; a hand-made entry may be odd
        self._variants.setdefault(base, set()).add(entry.workload)

    @property
    def threads(self) -> int | None:
        """The thread count these configs were tuned at: the document's, else the one most
        entries name (a warning when they disagree), else None (unknown)."""
        if self._threads is not None:
            return self._threads
        counts = Counter(e.threads for e in self._best.values() if e.threads is not None)
        if not counts:
            return None
        if len(counts) > 1:
            logger.warning("the configs were tuned at different thread counts (%s); taking "
                           "the most common", ", ".join(f"{t}: {n} configs"
                                                    for t, n in sorted(counts.items())))
        return counts.most_common(1)[0][0]

    def candidate_keys(self, workload: Workload, fallback_keys: Iterable[str] = ()) -> list[str]:
        """Keys whose tuned configs fit ``workload``, best match first: its own, the given
        fallbacks (its base), then every tuned sibling variant of the same base, fastest
        first."""
        keys = [workload.key, *fallback_keys]
        base = str(getattr(workload, "base_key", workload.key))
        siblings = sorted(self._variants.get(base, ()), key=lambda k: self._best[k].mean_cost)
        return list(dict.fromkeys([*keys, base, *siblings]))

    def entries(self) -> list[TunedEntry]:
        return list(self._best.values())

    def choose(self, workload: Workload, template: Template, fallback_keys: Iterable[str] = ()
               ) -> Choice | None:
        """The tuned config for ``workload`` (or for the first of ``candidate_keys`` that has
        one: the unfused base workload or another fused variant, whose space is the same),
        else None."""
        for key in self.candidate_keys(workload, fallback_keys):
            entry = self._best.get(key)
            if entry is None:
                continue
            if entry.template != template.name or (
                entry.template_version is not None and entry.template_version != template.version
            ):
                logger.warning("ignoring the tuned config of %s: it is for %s v%s, the build "
                               "uses %s v%s", key, entry.template, entry.template_version,
                               template.name, template.version)
                continue
            try:
                config = template.cached_space(workload).from_json(entry.config)
                template.check(workload, config)
            except ScheduleError as e:
                logger.warning("ignoring the tuned config of %s: %s", key, e)
                continue
            cost = entry.mean_cost if math.isfinite(entry.mean_cost) else None
            return Choice(config, "tuned", key, cost, entry.threads or self._threads)
        return None


def load_configs_file(path: Path, target: str = "llvm") -> ConfigBook:
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigSourceError(f"cannot read configs file {path}: {e}") from e
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if data is None or (isinstance(data, dict) and "tasks" not in data):
        lines = [line for line in text.splitlines() if line.strip()]
        try:
            records = [json.loads(line) for line in lines]
        except json.JSONDecodeError as e:
            raise ConfigSourceError(f"{path} is neither JSON nor JSON lines: {e}") from e
        return ConfigBook(_from_lines(records, path), target)
    return ConfigBook(entries_from_json(data, str(path)), target,
                      document_threads(data, str(path)))


def document_threads(data: Any, where: str) -> int | None:
    """The ``threads`` a ``tuner fetch`` document says its job measured at, if any."""
    value = data.get("threads") if isinstance(data, dict) else None
    return None if value is None else _threads(value, where)


def _threads(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
        raise ConfigSourceError(f"{where}: threads must be a whole number from 1 to 4096, "
                                f"got {value!r}")
    return value


def entries_from_json(data: Any, where: str) -> list[TunedEntry]:
    """Entries of a ``tuner fetch`` document or a tuning-log list."""
    items = data.get("tasks") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ConfigSourceError(f"{where}: expected a list of configs or an object with 'tasks'")
    out = []
    for item in items:
        if not isinstance(item, Mapping):
            raise ConfigSourceError(f"{where}: every entry must be an object")
        if item.get("config") is None or item.get("match") == "default":
            continue  # a task with nothing measured yet, or a template default
        cost = item.get("mean_cost", item.get("best_latency_s"))
        entry = _entry(item["workload"], item.get("template"), item.get("template_version"),
                       item["config"], cost, str(item.get("target") or ""), where)
        if item.get("threads") is not None:
            entry = dataclasses.replace(entry, threads=_threads(item["threads"], where))
        out.append(entry)
    return out


def _from_lines(records: list[Any], where: Path) -> list[TunedEntry]:
    out = []
    for record in records:
        if not isinstance(record, Mapping):
            raise ConfigSourceError(f"{where}: every line must be a JSON object")
        if "input" in record:  # AutoTVM style: [target, template, [key], {}]
            target, template, args = record["input"][0], record["input"][1], record["input"][2]
            costs, error = record["result"][0], record["result"][1]
            if error == ErrorKind.NONE and costs:
                out.append(_entry(args[0], template, None, record["config"],
                                  sum(costs) / len(costs), str(target), str(where)))
            continue
        result = record.get("result") or {}
        costs = result.get("costs") or []
        if result.get("error_kind", ErrorKind.NONE) == ErrorKind.NONE and costs:
            out.append(_entry(record["workload"], record.get("template"),
                              record.get("template_version"), record["config"],
                              sum(costs) / len(costs), str(record.get("target") or ""),
                              str(where)))
    return out


def _entry(key: Any, template: Any, version: Any, config: Any, cost: Any, target: str,
           where: str) -> TunedEntry:
    try:
        canonical = parse_workload(str(key)).key
    except ScheduleError as e:
        raise ConfigSourceError(f"{where}: bad workload key {key!r}: {e}") from e
    if not template:
        raise ConfigSourceError(f"{where}: the entry for {canonical} names no template")
    return TunedEntry(canonical, str(template), None if version is None else int(version),
                      config, float(cost) if cost is not None else math.inf, target)
