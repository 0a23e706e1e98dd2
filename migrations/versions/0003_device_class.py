"""Device classes: best configs per (workload, target, device class, threads); measurements
carry the class and threads they were taken with, their noise, and why they were taken.

Existing rows: best configs get device class ``unknown`` (nobody recorded the hardware) and
the thread count of the job that measured them (what the server sent: the job's ``threads``,
else 1); imported ones, whose thread count nobody knows, get 1 (the protocol's default).
Finished job measurements get the same thread count; their device class stays NULL (unknown).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

#: gives the unnamed unique constraint of 0001 a name SQLite's batch mode can drop
_NAMING = {"uq": "uq_%(table_name)s_%(column_0_name)s"}
_OLD_UNIQUE = {"sqlite": "uq_tuning_log_workload_key",
               "postgresql": "tuning_log_workload_key_target_key"}


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    with op.batch_alter_table("measurements") as batch:
        batch.add_column(sa.Column("device_class", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("threads", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("noisy", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("load", sa.Float(), nullable=True))
        batch.add_column(sa.Column("purpose", sa.String(length=16), nullable=False,
                                   server_default="tune"))
    with op.batch_alter_table("tuning_log", naming_convention=_NAMING) as batch:
        batch.add_column(sa.Column("device_class", sa.String(length=255), nullable=False,
                                   server_default="unknown"))
        batch.add_column(sa.Column("microarch", sa.String(length=64), nullable=False,
                                   server_default="unknown"))
        batch.add_column(sa.Column("isa_level", sa.String(length=64), nullable=False,
                                   server_default="unknown"))
        batch.add_column(sa.Column("threads", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("spread", sa.Float(), nullable=True))
        batch.add_column(sa.Column("confirmed", sa.Boolean(), nullable=False,
                                   server_default=sa.false()))
        batch.drop_constraint(_OLD_UNIQUE.get(dialect, _OLD_UNIQUE["postgresql"]),
                              type_="unique")
        batch.create_unique_constraint(
            "uq_tuning_log_device", ["workload_key", "target", "device_class", "threads"])
        batch.create_index("ix_tuning_log_workload", ["workload_key", "target"])
    _migrate_rows()


def _migrate_rows() -> None:
    """Thread counts of existing rows, from the jobs that measured them."""
    op.execute(sa.text(
        "UPDATE tuning_log SET threads = COALESCE("
        "(SELECT jobs.threads FROM jobs WHERE jobs.id = tuning_log.job_id), 1)"))
    op.execute(sa.text(
        "UPDATE measurements SET threads = COALESCE("
        "(SELECT jobs.threads FROM jobs JOIN job_tasks ON job_tasks.job_id = jobs.id "
        "WHERE job_tasks.id = measurements.job_task_id), 1) "
        "WHERE state = 'done' AND job_task_id IS NOT NULL"))


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    # one entry per (workload, target) again: keep the fastest of each
    op.execute(sa.text(
        "DELETE FROM tuning_log WHERE id NOT IN (SELECT id FROM (SELECT id, ROW_NUMBER() OVER "
        "(PARTITION BY workload_key, target ORDER BY mean_cost, id) AS n FROM tuning_log) "
        "AS ranked WHERE n = 1)"))
    with op.batch_alter_table("tuning_log", naming_convention=_NAMING) as batch:
        batch.drop_index("ix_tuning_log_workload")
        batch.drop_constraint("uq_tuning_log_device", type_="unique")
        batch.create_unique_constraint(
            _OLD_UNIQUE.get(dialect, _OLD_UNIQUE["postgresql"]), ["workload_key", "target"])
        for column in ("confirmed", "spread", "threads", "isa_level", "microarch",
                       "device_class"):
            batch.drop_column(column)
    with op.batch_alter_table("measurements") as batch:
        for column in ("purpose", "load", "noisy", "threads", "device_class"):
            batch.drop_column(column)
