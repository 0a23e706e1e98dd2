"""Dashboard fixtures: a live server (settings, apps and tokens come from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dashboard_support import serve

from tuner_service.settings import Settings


@pytest.fixture
def live_server(settings: Settings) -> Iterator[str]:
    """The app under uvicorn on a loopback port."""
    with serve(settings) as url:
        yield url
