"""The REST API (FastAPI). ``create_api(settings)`` builds it; nothing happens at import.

The served application (the API with the dashboard at ``/``) is ``tuner_service.app``.
"""

from tuner_service.api.app import create_api

__all__ = ["create_api"]
