"""Alembic driven from code, so it works from an installed package (no ini file lookup by cwd)."""

from __future__ import annotations

import importlib.resources
import logging

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.exc import SQLAlchemyError

from tuner_service.db.engine import make_engine, normalize_url
from tuner_service.db.errors import DatabaseError, SchemaOutdatedError

logger = logging.getLogger(__name__)


def alembic_config(url: str) -> Config:
    package = importlib.resources.files("migrations")
    config = Config(str(package / "alembic.ini"))
    config.set_main_option("script_location", str(package))
    # '%' must be doubled for ConfigParser interpolation (URL-encoded passwords)
    config.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    config.attributes["configure_logging"] = False
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None, "migrations/versions holds no revision"
    return head


def current_revision(url: str) -> str | None:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    except SQLAlchemyError as e:
        raise DatabaseError(f"cannot read the schema revision of {_safe(url)}: {e}") from e
    finally:
        engine.dispose()


def upgrade(url: str, revision: str = "head") -> None:
    logger.info("upgrading %s to %s", _safe(url), revision)
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def check_schema(url: str) -> None:
    """Raise SchemaOutdatedError unless the database is at the migration head."""
    current, head = current_revision(url), head_revision()
    if current != head:
        raise SchemaOutdatedError(
            f"database schema is at revision {current or 'none (empty)'}, this server needs "
            f"{head}; run `tuner db upgrade --database URL` first"
        )


def _safe(url: str) -> str:
    """The URL without its password, for messages."""
    from sqlalchemy.engine import make_url

    return make_url(normalize_url(url)).render_as_string(hide_password=True)
