"""Alembic migrations: the only thing that creates or changes the service's tables."""
