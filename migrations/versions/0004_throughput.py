"""Throughput: each result's time split, and indexes for the queries every claim, report,
requeue and dashboard refresh runs.

* ``measurements.timings``: where a worker's time per candidate went (wait, claim, build,
  check, measure, report seconds), as the worker reported it; NULL for older results.
* ``ix_measurements_lease``: expired-lease sweeps (``state = 'leased' AND lease_expires_at <
  now``) run every driver step on every replica; without it each one scans the table.
* ``ix_measurements_finished``: the dashboard's per-worker throughput and time split read
  the results of the last hour (``finished_at`` range).
* ``ix_measurements_task_state``: a job's progress reads (health, observe, history) filter a
  job task's measurements by state.
* ``ix_workers_online``: "workers online for this target and device" sizes each job's queue
  on every driver step.

Existing rows are left as they are.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_INDEXES = (
    ("measurements", "ix_measurements_lease", ["state", "lease_expires_at"]),
    ("measurements", "ix_measurements_finished", ["finished_at", "worker_id"]),
    ("measurements", "ix_measurements_task_state", ["job_task_id", "state"]),
    ("workers", "ix_workers_online", ["target", "device_key", "last_heartbeat"]),
)


def upgrade() -> None:
    with op.batch_alter_table("measurements") as batch:
        batch.add_column(sa.Column("timings", sa.JSON(), nullable=True))
    for table, name, columns in _INDEXES:
        op.create_index(name, table, columns)


def downgrade() -> None:
    for table, name, _columns in reversed(_INDEXES):
        op.drop_index(name, table_name=table)
    with op.batch_alter_table("measurements") as batch:
        batch.drop_column("timings")
