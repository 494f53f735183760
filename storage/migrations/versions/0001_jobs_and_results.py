"""jobs and results

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("job_key", sa.String(64), nullable=False),
        sa.Column("content_sha256", sa.String(64), nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("page", sa.Integer, nullable=False),
        sa.Column("lane", sa.String(16), nullable=False),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("task", sa.String(16), nullable=False),
        sa.Column("task_options", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("error_stage", sa.String(16)),
        sa.Column("original_key", sa.Text),
        sa.Column("result_key", sa.Text),
        sa.Column("annotated_key", sa.Text),
        sa.Column("engine", sa.String(64)),
        *(sa.Column(f"{stage}_s", sa.Float) for stage in
          ("upload", "queue_wait", "preprocess", "inference", "postprocess", "store")),
        sa.Column("created_at", _TS, nullable=False, server_default=sa.func.now()),
        sa.Column("enqueued_at", _TS),
        sa.Column("started_at", _TS),
        sa.Column("finished_at", _TS),
        sa.Column("updated_at", _TS, nullable=False, server_default=sa.func.now()),
        sa.UniqueConstraint("job_key", name="uq_jobs_job_key"),
    )
    op.create_index("ix_jobs_status_lane", "jobs", ["status", "lane"])
    op.create_index("ix_jobs_content_sha256", "jobs", ["content_sha256"])
    op.create_table(
        "results",
        sa.Column("job_id", sa.String(36), primary_key=True),
        sa.Column("content_sha256", sa.String(64), nullable=False),
        sa.Column("task", sa.String(16), nullable=False),
        sa.Column("engine", sa.String(64), nullable=False),
        sa.Column("line_count", sa.Integer, nullable=False),
        sa.Column("mean_confidence", sa.Float),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("result_key", sa.Text, nullable=False),
        sa.Column("annotated_key", sa.Text),
        sa.Column("created_at", _TS, nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_results_content_sha256", "results", ["content_sha256"])


def downgrade() -> None:
    op.drop_table("results")
    op.drop_table("jobs")
