"""Shared fixtures: ``database_url`` runs a test on SQLite (a temporary file) and on PostgreSQL
(a fresh schema in 127.0.0.1:5432/test, dropped afterwards; skipped when unreachable)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=3"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="session")
def postgres_available() -> str:
    """Empty string when PostgreSQL answers, else the reason it does not."""
    try:
        import psycopg

        with psycopg.connect(PG_DSN) as conn:
            conn.execute("SELECT 1")
    except Exception as e:  # any failure means: skip the PostgreSQL half
        return f"PostgreSQL at 127.0.0.1:5432/test unreachable: {e}"
    return ""


def _postgres_schema_url(reason: str) -> Iterator[str]:
    if reason:
        pytest.skip(reason)
    import psycopg

    schema = f"tuner_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path,
                 postgres_available: str) -> Iterator[str]:
    """An empty database (no tables): SQLite file or a private PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'tuner.db'}"
    else:
        yield from _postgres_schema_url(postgres_available)


@pytest.fixture
def migrated_url(database_url: str) -> str:
    """``database_url`` upgraded to the migration head."""
    from tuner_service.db.migrate import upgrade

    upgrade(database_url)
    return database_url
