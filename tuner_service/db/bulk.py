"""Statements whose text stays the same whatever the number of rows they carry.

A multi-row ``VALUES`` list or an ``IN (...)`` of a thousand bound parameters is a new, long
statement each time: psycopg parses its text again on every call (statements of a new length
miss its cache) and PostgreSQL plans it again. On PostgreSQL the rows travel as one array per
column instead (``unnest``, ``= ANY``), or as one JSON document (``json_rows``: one C-encoded
parameter, where a dozen arrays cost psycopg a text escape per value): one short statement,
parsed once, one round trip. SQLite runs in-process, where the plain forms cost nothing extra,
so it keeps them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import JSON, ColumnElement, Table, any_, bindparam, column, func, insert, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session
from sqlalchemy.sql.selectable import TableValuedAlias
from sqlalchemy.types import Text, TypeEngine


def _postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def ids_in(session: Session, column: Any, ids: Sequence[int]) -> ColumnElement[bool]:
    """``column IN ids`` as one array parameter on PostgreSQL."""
    if _postgres(session):
        return column == any_(bindparam(None, list(ids), type_=ARRAY(column.type)))
    return column.in_(list(ids))


def json_rows(table: Table, columns: Sequence[str], param: str) -> TableValuedAlias:
    """PostgreSQL's ``json_to_recordset(:param)`` typed as ``table``'s ``columns``: rows bound
    as one JSON list of objects (the engine's JSON serializer: finite numbers only), to join
    an ``UPDATE ... FROM`` or feed an ``INSERT ... SELECT``."""
    return (func.json_to_recordset(bindparam(param, type_=JSON))
            .table_valued(*(column(name, table.c[name].type) for name in columns))
            .render_derived(with_types=True))


def insert_rows(session: Session, table: Table, rows: Sequence[dict[str, Any]]) -> list[int]:
    """Insert ``rows`` (dicts with the same keys) in one statement; their new ids, in order.

    On PostgreSQL the columns travel as arrays and ``unnest ... WITH ORDINALITY`` keeps the
    rows' order, so the sequence hands out ascending ids in that order."""
    if not rows:
        return []
    if not _postgres(session):
        return list(session.scalars(
            insert(table).returning(table.c.id, sort_by_parameter_order=True), list(rows)))
    columns = list(rows[0])
    params, selects = [], []
    for position, name in enumerate(columns):
        column_type: TypeEngine[Any] = table.c[name].type
        values = [row[name] for row in rows]
        if isinstance(column_type, JSON):  # as text, cast back on the server
            values = [None if v is None else json.dumps(v, allow_nan=False) for v in values]
            column_type = Text()
            selects.append(f"CAST(u.c{position} AS JSON)")
        else:
            selects.append(f"u.c{position}")
        params.append(bindparam(f"a{position}", values, type_=ARRAY(column_type)))
    names = ", ".join(f"c{i}" for i in range(len(columns)))
    arrays = ", ".join(f":a{i}" for i in range(len(columns)))
    stmt = text(
        f"INSERT INTO {table.name} ({', '.join(columns)}) "
        f"SELECT {', '.join(selects)} FROM unnest({arrays}) WITH ORDINALITY AS u({names}, n) "
        f"ORDER BY u.n RETURNING id").bindparams(*params)
    return sorted(int(i) for i in session.scalars(stmt))
