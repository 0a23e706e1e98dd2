"""The served application: the REST API with the dashboard at ``/``.

It sits above both: the dashboard's routes use the API's dependencies, so the API cannot mount
the dashboard itself without the two packages importing each other.
"""

from __future__ import annotations

from fastapi import FastAPI

from tuner_service import dashboard
from tuner_service.api import create_api
from tuner_service.settings import Settings


def create_app(settings: Settings | None = None) -> FastAPI:
    """The API (``create_api``) with the dashboard mounted; nothing connects until it starts."""
    app = create_api(settings)
    dashboard.mount(app)
    return app
