"""The REST API (FastAPI). ``create_app(settings)`` builds it; nothing happens at import."""

from tuner_service.api.app import create_app

__all__ = ["create_app"]
