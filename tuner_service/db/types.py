"""Column types. ``UtcDateTime``: timestamps are UTC and time-zone-aware on every database;
``StoredEnum``: states and error kinds as enum members, stored as their values.

SQLite has no time-zone type: SQLAlchemy stores a datetime there as text and silently drops any
offset, so ``12:00+14:00`` would read back as ``12:00`` UTC. This type converts every value to
UTC before it is stored and attaches UTC to what comes back, on SQLite and PostgreSQL alike. The
column DDL is unchanged (``DateTime(timezone=True)``), so no migration is needed.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any, TypeVar

from sqlalchemy import DateTime, String
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

E = TypeVar("E", bound=enum.Enum)

#: timestamps every database and client can hold (PostgreSQL and Python part ways at the edges
#: of year 1 and 9999, and an offset can push a value past them)
EARLIEST = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
LATEST = dt.datetime(9000, 1, 1, tzinfo=dt.UTC)


def bounded_utc(value: dt.datetime) -> dt.datetime:
    """``value`` in UTC if it lies from 1970 to 9000, else ValueError."""
    try:
        utc = as_utc(value)
    except OverflowError as e:
        raise ValueError(f"timestamp {value.isoformat()} out of range (1970 to 9000 UTC)") from e
    if not EARLIEST <= utc < LATEST:
        raise ValueError(f"timestamp {value.isoformat()} out of range (1970 to 9000 UTC)")
    return utc


def as_utc(value: dt.datetime) -> dt.datetime:
    """``value`` in UTC; a naive value is taken to be UTC already. Raises OverflowError when the
    conversion leaves the datetime range (``0001-01-01T00:00+14:00``)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


class UtcDateTime(TypeDecorator[dt.datetime]):
    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if not isinstance(value, dt.datetime):
            return value  # None, or a SQL expression's text
        utc = as_utc(value)
        # SQLite's text layout cannot hold an offset; the value is UTC by construction
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: Any, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        return as_utc(value)


class StoredEnum(TypeDecorator[E]):
    """An enum member stored as its value in the column type ``impl`` (``String(16)`` for a
    state, ``Integer`` for an error kind), so typing a column needs no migration. Members read
    back; writes take a member or its value, and anything else raises ValueError."""

    impl: TypeEngine[Any] | type[TypeEngine[Any]] = String
    cache_ok = True

    def __init__(self, enum_class: type[E], impl: TypeEngine[Any]) -> None:
        super().__init__()
        self.enum_class = enum_class
        self.impl = impl

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else self.enum_class(value).value

    def process_result_value(self, value: Any, dialect: Dialect) -> E | None:
        return None if value is None else self.enum_class(value)
