"""Database layer: tables, engine and session scope, migrations, states.

Nothing is imported here, so a client that needs only the states (``db.states``) does not load
SQLAlchemy.
"""
