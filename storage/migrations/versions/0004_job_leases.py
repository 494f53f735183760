"""leases on running jobs: which worker holds a job, and until when (also in the page_status view)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None



def _page_status(*, leases: bool) -> str:
    held = (",\n               CASE WHEN j.status = 'running' THEN j.worker END AS worker,"
            "\n               CASE WHEN j.status = 'running' THEN j.lease_until END AS lease_until") if leases else ""
    return f"""
        CREATE VIEW page_status AS
        SELECT p.id AS page_id, p.document_id, p.ingest_id, p.page_no, d.source, p.job_id,
               CASE WHEN j.status = 'queued' AND j.enqueued_at IS NULL THEN 'unpublished' ELSE j.status END
                   AS status,
               j.attempts, j.error, j.error_stage, j.result_key, j.annotated_key, j.lane, j.task,
               j.upload_s, j.queue_wait_s, j.preprocess_s, j.inference_s, j.postprocess_s, j.store_s,
               j.started_at, j.finished_at{held}
        FROM pages p JOIN jobs j ON j.id = p.job_id JOIN documents d ON d.id = p.document_id
    """


def upgrade() -> None:
    op.execute("DROP VIEW page_status")
    # Plain ALTER TABLE (SQLite 3.35+ drops columns too): a batch copy of jobs would break the views on it.
    op.add_column("jobs", sa.Column("worker", sa.String(200)))
    op.add_column("jobs", sa.Column("lease_until", sa.DateTime(timezone=True)))
    op.execute(_page_status(leases=True))


def downgrade() -> None:
    op.execute("DROP VIEW page_status")
    op.drop_column("jobs", "lease_until")
    op.drop_column("jobs", "worker")
    op.execute(_page_status(leases=False))
