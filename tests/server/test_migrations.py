"""Alembic upgrade from empty on SQLite and PostgreSQL; the server refuses an old schema."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import inspect

from tuner_service.app import create_app
from tuner_service.db.engine import make_engine
from tuner_service.db.errors import SchemaOutdatedError
from tuner_service.db.migrate import current_revision, downgrade, head_revision, upgrade
from tuner_service.db.models import Base
from tuner_service.settings import Settings


def test_upgrade_from_empty_creates_every_table(database_url: str) -> None:
    assert current_revision(database_url) is None
    upgrade(database_url)
    assert current_revision(database_url) == head_revision()
    engine = make_engine(database_url)
    try:
        tables = set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert set(Base.metadata.tables) <= tables


def test_downgrade_then_upgrade_again(database_url: str) -> None:
    upgrade(database_url)
    downgrade(database_url, "base")
    assert current_revision(database_url) is None
    upgrade(database_url)
    assert current_revision(database_url) == head_revision()


def test_server_refuses_a_database_that_is_not_at_head(database_url: str,
                                                       tmp_path: Path) -> None:
    app = create_app(Settings(database_url=database_url, data_dir=tmp_path))
    with pytest.raises(SchemaOutdatedError, match="tuner db upgrade"), TestClient(app):
        pass


def test_cli_db_upgrade_and_current(database_url: str, capsys: pytest.CaptureFixture[str]
                                    ) -> None:
    from tuner_service.cli.main import main

    assert main(["db", "current", "--database", database_url]) == 1
    assert main(["db", "upgrade", "--database", database_url]) == 0
    assert main(["db", "current", "--database", database_url]) == 0
    assert head_revision() in capsys.readouterr().out


def test_cli_serve_refuses_old_schema(database_url: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from tuner_service.cli.main import main

    assert main(["serve", "--database", database_url, "--port", "0"]) == 2
    assert "tuner db upgrade" in capsys.readouterr().err


def test_upgrade_from_0001_keeps_rows_and_adds_the_security_columns(database_url: str) -> None:
    from sqlalchemy import text

    upgrade(database_url, "0001")
    engine = make_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO tokens (name, role, token_hash, revoked) "
                              "VALUES ('old', 'worker', 'abc', false)"))
            conn.execute(text("INSERT INTO jobs (target, trials_per_task, tuner, options, "
                              "status, message) VALUES ('llvm', 4, 'random', '{}', 'queued', '')"))
        upgrade(database_url, "0002")
        with engine.connect() as conn:
            token = conn.execute(text("SELECT name, device_key FROM tokens")).one()
            job = conn.execute(text("SELECT target, owner_token_id FROM jobs")).one()
    finally:
        engine.dispose()
    assert tuple(token) == ("old", None)  # an old token stays valid for every device key
    assert tuple(job) == ("llvm", None)  # an old job has no owner: only an admin cancels it
    downgrade(database_url, "0001")
    assert current_revision(database_url) == "0001"
