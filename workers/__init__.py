"""The measurement agent: pulls candidates from the server, builds and times them in isolation,
reports classified results.

A worker installs without fastapi, sqlalchemy or xgboost; nothing here imports them. Submodules
are imported on use so that ``import workers`` stays cheap.
"""

from workers.errors import WorkerError

__all__ = ["WorkerError"]
