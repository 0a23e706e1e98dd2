"""Timestamps from the database clock, so leases mean the same on every server and worker host.

``utcnow()`` and ``utcnow_plus(seconds)`` compile to the dialect's own clock expression.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import DateTime, func, literal
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement


class utcnow_plus(FunctionElement[Any]):
    """The database's current UTC time plus ``seconds`` (may be negative or zero)."""

    type = DateTime(timezone=True)
    inherit_cache = True

    def __init__(self, seconds: float = 0.0) -> None:
        # Every value is a bound parameter, so cached compiled statements stay correct.
        super().__init__(
            literal(float(seconds)),
            literal(f"{float(seconds):+.6f} seconds"),
            literal("%Y-%m-%d %H:%M:%f"),
        )


def utcnow() -> utcnow_plus:
    return utcnow_plus(0.0)


def _arg(element: utcnow_plus, position: int, compiler: Any, **kw: Any) -> str:
    return str(compiler.process(list(element.clauses)[position], **kw))


@compiles(utcnow_plus, "sqlite")
def _sqlite_now(element: utcnow_plus, compiler: Any, **kw: Any) -> str:
    # Same text layout SQLAlchemy uses for SQLite datetimes, so comparisons sort correctly.
    fmt, modifier = _arg(element, 2, compiler, **kw), _arg(element, 1, compiler, **kw)
    return f"strftime({fmt}, 'now', {modifier})"


@compiles(utcnow_plus, "postgresql")
def _postgres_now(element: utcnow_plus, compiler: Any, **kw: Any) -> str:
    seconds = _arg(element, 0, compiler, **kw)
    return f"(clock_timestamp() + make_interval(secs => CAST({seconds} AS DOUBLE PRECISION)))"


@compiles(utcnow_plus)
def _default_now(element: utcnow_plus, compiler: Any, **kw: Any) -> str:
    return str(compiler.process(func.now(), **kw))
