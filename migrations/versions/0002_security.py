"""Security: worker tokens bound to a device key; jobs remember the token that created them.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # batch mode: SQLite cannot drop a column in place (downgrade), so keep both directions alike
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("device_key", sa.String(length=255), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("owner_token_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("owner_token_id")
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("device_key")
