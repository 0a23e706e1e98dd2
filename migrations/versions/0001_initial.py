"""Initial schema: models, tasks, jobs, job tasks, measurements, workers, tokens, tuning log.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("unsupported", sa.JSON(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("(CURRENT_TIMESTAMP)"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("sha256"),
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("(CURRENT_TIMESTAMP)"),
            nullable=False,
        ),
        sa.Column("revoked", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
    )
    op.create_table(
        "tuning_log",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload_key", sa.String(length=512), nullable=False),
        sa.Column("op", sa.String(length=64), nullable=False),
        sa.Column("target", sa.String(length=255), nullable=False),
        sa.Column("template", sa.String(length=128), nullable=False),
        sa.Column("template_version", sa.Integer(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("mean_cost", sa.Float(), nullable=False),
        sa.Column("gflops", sa.Float(), nullable=False),
        sa.Column("measurement_id", sa.Integer(), nullable=True),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("device_key", sa.String(length=255), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("(CURRENT_TIMESTAMP)"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("workload_key", "target"),
    )
    op.create_index("ix_tuning_log_op", "tuning_log", ["op"], unique=False)

    op.create_table(
        "workers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("device_key", sa.String(length=255), nullable=False),
        sa.Column("target", sa.String(length=255), nullable=False),
        sa.Column("hardware", sa.JSON(), nullable=False),
        sa.Column("software", sa.JSON(), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=True),
        sa.Column(
            "registered_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("(CURRENT_TIMESTAMP)"),
            nullable=False,
        ),
        sa.Column("last_heartbeat", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=True),
        sa.Column("target", sa.String(length=255), nullable=False),
        sa.Column("device_key", sa.String(length=255), nullable=True),
        sa.Column("trials_per_task", sa.Integer(), nullable=False),
        sa.Column("tuner", sa.String(length=64), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("threads", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("(CURRENT_TIMESTAMP)"),
            nullable=False,
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("driver_owner", sa.String(length=64), nullable=True),
        sa.Column("driver_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_jobs_status", "jobs", ["status"], unique=False)

    op.create_table(
        "tasks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=True),
        sa.Column("workload_key", sa.String(length=512), nullable=False),
        sa.Column("op", sa.String(length=64), nullable=False),
        sa.Column("weight", sa.Integer(), nullable=False),
        sa.Column("flops", sa.BigInteger(), nullable=False),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "job_tasks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("template", sa.String(length=128), nullable=True),
        sa.Column("template_version", sa.Integer(), nullable=True),
        sa.Column("trials_budget", sa.Integer(), nullable=False),
        sa.Column("trials_done", sa.Integer(), nullable=False),
        sa.Column("best_measurement_id", sa.Integer(), nullable=True),
        sa.Column("best_cost", sa.Float(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["tasks.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "task_id"),
    )
    op.create_index("ix_job_tasks_job_id", "job_tasks", ["job_id"], unique=False)

    op.create_table(
        "measurements",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("uid", sa.String(length=64), nullable=False),
        sa.Column("job_task_id", sa.Integer(), nullable=True),
        sa.Column("config_index", sa.BigInteger(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("template", sa.String(length=128), nullable=False),
        sa.Column("template_version", sa.Integer(), nullable=False),
        sa.Column("workload_key", sa.String(length=512), nullable=False),
        sa.Column("target", sa.String(length=255), nullable=False),
        sa.Column("device_key", sa.String(length=255), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("lease_owner", sa.Integer(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("costs", sa.JSON(), nullable=True),
        sa.Column("mean_cost", sa.Float(), nullable=True),
        sa.Column("error_kind", sa.Integer(), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=False),
        sa.Column("compile_time_s", sa.Float(), nullable=True),
        sa.Column("wall_time_s", sa.Float(), nullable=True),
        sa.Column("peak_gflops", sa.Float(), nullable=True),
        sa.Column("worker_id", sa.Integer(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("(CURRENT_TIMESTAMP)"),
            nullable=False,
        ),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["job_task_id"], ["job_tasks.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("uid"),
    )
    op.create_index(
        "ix_measurements_claim", "measurements", ["state", "target", "device_key", "id"]
    )
    op.create_index("ix_measurements_job_task_id", "measurements", ["job_task_id"])
    op.create_index("ix_measurements_workload", "measurements", ["workload_key", "target"])


def downgrade() -> None:
    op.drop_index("ix_measurements_workload", table_name="measurements")
    op.drop_index("ix_measurements_job_task_id", table_name="measurements")
    op.drop_index("ix_measurements_claim", table_name="measurements")

    op.drop_table("measurements")
    op.drop_index("ix_job_tasks_job_id", table_name="job_tasks")

    op.drop_table("job_tasks")
    op.drop_table("tasks")
    op.drop_index("ix_jobs_status", table_name="jobs")

    op.drop_table("jobs")
    op.drop_table("workers")
    op.drop_index("ix_tuning_log_op", table_name="tuning_log")

    op.drop_table("tuning_log")
    op.drop_table("tokens")
    op.drop_table("models")
