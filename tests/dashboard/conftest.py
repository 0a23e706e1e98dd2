"""Dashboard fixtures: settings on a migrated database, apps, tokens and a live server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from dashboard_support import serve
from fastapi.testclient import TestClient

from tuner_service.settings import Settings


@pytest.fixture
def settings(migrated_url: str, tmp_path: Path) -> Settings:
    return Settings(
        database_url=migrated_url, data_dir=tmp_path / "data", lease_s=30.0, heartbeat_s=5.0,
        driver_interval_s=0.05, driver_lease_s=5.0, batch_size=4, queue_depth=8,
        claim_max_wait_s=2.0,
    )


@pytest.fixture
def make_client() -> Iterator[Callable[[Settings], TestClient]]:
    from tuner_service.api import create_app

    opened: list[TestClient] = []

    def make(settings: Settings) -> TestClient:
        client = TestClient(create_app(settings))
        client.__enter__()
        opened.append(client)
        return client

    yield make
    for client in reversed(opened):
        client.__exit__(None, None, None)


@pytest.fixture
def client(settings: Settings, make_client: Callable[[Settings], TestClient]) -> TestClient:
    return make_client(settings)


@pytest.fixture
def tokens(settings: Settings) -> dict[str, str]:
    from tuner_service import auth
    from tuner_service.db.engine import Database

    db = Database(settings.resolved_database_url)
    try:
        with db.session() as session:
            return {role: auth.create_token(session, role, f"test-{role}")[1]
                    for role in auth.ROLES}
    finally:
        db.dispose()


@pytest.fixture
def live_server(settings: Settings) -> Iterator[str]:
    """The app under uvicorn on a loopback port."""
    with serve(settings) as url:
        yield url
