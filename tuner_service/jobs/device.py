"""Best configs per device class: which stored entry answers a lookup, and at what level.

A lookup names a device class and a thread count. It is answered, in order, by

* ``exact``: an entry of that class measured with that thread count;
* ``microarch``: an entry of another model or core count of the same microarchitecture
  (same kind and vendor), the same thread count first, else the nearest;
* ``isa_level``: an entry of the same ISA level (x86-64-v4, armv8-sve, sm_9x), likewise;
* ``default``: nothing related is known, the template's default config.

Entries of class ``unknown`` (recorded before device classes) answer no level: where they were
measured is not known. A lookup without a device class (``any``) takes the fastest entry of any
class, as the log did before classes existed, and says so.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from schedule_templates.workloads import parse_workload
from tuner_service.db.models import TuningLogEntry, Worker
from tuner_service.errors import InvalidInputError
from workers.device_class import UNKNOWN, DeviceClass, DeviceClassError


class Match(enum.Enum):
    EXACT = "exact"
    MICROARCH = "microarch"
    ISA_LEVEL = "isa_level"
    DEFAULT = "default"
    ANY = "any"  # the lookup named no device class


#: the levels a lookup with a device class tries, in order, before the template default
LEVELS = (Match.EXACT, Match.MICROARCH, Match.ISA_LEVEL)


@dataclasses.dataclass(frozen=True)
class DeviceQuery:
    """The device a lookup is for; ``device_class`` None means any."""

    device_class: DeviceClass | None
    threads: int = 1

    @classmethod
    def parse(cls, device_class: str | None, threads: int | None) -> DeviceQuery:
        if threads is not None and threads < 1:
            raise InvalidInputError(f"threads must be at least 1, not {threads}")
        return cls(parse_class(device_class) if device_class else None, threads or 1)


def parse_class(text: str) -> DeviceClass:
    try:
        return DeviceClass.parse(text)
    except DeviceClassError as e:
        raise InvalidInputError(str(e)) from e


def level_of(entry: TuningLogEntry, query: DeviceQuery) -> Match | None:
    """The best level at which ``entry`` answers ``query`` (None: it does not)."""
    if query.device_class is None:
        return Match.ANY
    return class_level(entry.device_class, query.device_class, entry.threads == query.threads)


def class_level(have: str, wanted: DeviceClass, same_threads: bool = True) -> Match | None:
    """How close a record of class ``have`` is to ``wanted`` (None: unrelated or unknown)."""
    if have == UNKNOWN:
        return None
    if have == wanted.id and same_threads:
        return Match.EXACT
    parsed = DeviceClass.parse(have)
    if (parsed.kind, parsed.vendor, parsed.microarch) == (wanted.kind, wanted.vendor,
                                                          wanted.microarch):
        return Match.MICROARCH
    if (parsed.kind, parsed.isa_level) == (wanted.kind, wanted.isa_level):
        return Match.ISA_LEVEL
    return None


def pick(entries: Sequence[TuningLogEntry], query: DeviceQuery, key: str
         ) -> tuple[TuningLogEntry, Match] | None:
    """The entry answering ``query`` best among the entries of ``key``'s family."""
    base = parse_workload(key).base_key
    ranked = []
    for entry in entries:
        level = level_of(entry, query)
        if level is None:
            continue
        order = (list(Match).index(level),
                 abs(entry.threads - query.threads) if level is not Match.ANY else 0,
                 entry.workload_key != key, entry.workload_key != base,
                 -entry.template_version, entry.mean_cost, entry.workload_key)
        ranked.append((order, entry, level))
    if not ranked:
        return None
    _order, entry, level = min(ranked, key=lambda item: item[0])
    return entry, level


def family_entries(session: Session, key: str, target: str) -> list[TuningLogEntry]:
    """Entries of ``key``, its base workload and its fused siblings on ``target`` (a fused
    workload and its base share one search space): fp32 epilogues, or a quantized addition
    fused into an int8 layer (``dense_int8:...,add=u8``; both are the key's last parameter)."""
    base = parse_workload(key).base_key
    siblings = [TuningLogEntry.workload_key.startswith(f"{base},{fused}=", autoescape=True)
                for fused in ("epilogue", "add")]
    return list(session.scalars(select(TuningLogEntry).where(
        TuningLogEntry.target == target,
        or_(TuningLogEntry.workload_key == key, TuningLogEntry.workload_key == base, *siblings),
    )))


def resolve(session: Session, key: str, target: str, query: DeviceQuery
            ) -> tuple[TuningLogEntry, Match] | None:
    return pick(family_entries(session, key, target), query, key)


def class_columns(device_class: str | None) -> dict[str, Any]:
    """The tuning-log columns derived from a class id (``unknown`` for None)."""
    parsed = DeviceClass.parse(device_class or UNKNOWN)
    return {"device_class": parsed.id if device_class else UNKNOWN,
            "microarch": parsed.microarch, "isa_level": parsed.isa_level}


def worker_class(session: Session, target: str, device_key: str | None) -> str | None:
    """The device class the latest worker of ``device_key`` (else of ``target``) registered
    with; None when no such worker reported one."""
    query = select(Worker.hardware).order_by(Worker.last_heartbeat.desc().nulls_last(),
                                             Worker.id.desc()).limit(1)
    query = (query.where(Worker.device_key == device_key) if device_key
             else query.where(Worker.target == target))
    return class_of_hardware(session.scalars(query).first())


def class_of_hardware(hardware: Any) -> str | None:
    """The device class id in a worker's registered ``hardware`` (None: an older worker that
    reported none, or one that cannot be read)."""
    found = hardware.get("device_class") if isinstance(hardware, dict) else None
    text = found.get("id") if isinstance(found, dict) else None
    try:
        return DeviceClass.parse(text).id if isinstance(text, str) and text else None
    except DeviceClassError:
        return None
