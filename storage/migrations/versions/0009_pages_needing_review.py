"""pages needing review: a job's quality grade (needs_review, its flags, its confidence), counted on documents and
ingests like succeeded and failed pages, in the status views, and listed by the review_queue view

Jobs done before this migration have no grade: none of them needs review.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import importlib

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_VIEWS = ("ingest_status", "document_status", "page_status")
_STATUS_VIEWS = importlib.import_module("paperlane.storage.migrations.versions.0005_document_outputs_and_status_views")


def upgrade() -> None:
    for view in _VIEWS:
        op.execute(f"DROP VIEW {view}")
    # Plain ALTER TABLE (no batch copy on SQLite), as 0004.
    op.add_column("jobs", sa.Column("needs_review", sa.Boolean, nullable=False, server_default=sa.false()))
    op.add_column("jobs", sa.Column("review_flags", sa.Text))
    op.add_column("jobs", sa.Column("confidence", sa.Float))
    op.create_index("ix_jobs_review", "jobs", ["id"], postgresql_where=sa.text("needs_review"),
                    sqlite_where=sa.text("needs_review"))
    for table in ("documents", "ingests"):
        op.add_column(table, sa.Column("pages_review", sa.Integer, nullable=False, server_default="0"))
    create_views()


def create_views() -> None:
    """The status views and the review queue as this migration leaves them (0010 builds them again)."""
    _STATUS_VIEWS._create_views(op.get_bind().dialect.name, review=True)
    op.execute("""
        CREATE VIEW review_queue AS
        SELECT p.ingest_id, i.tenant_id, p.document_id, d.source, p.page_no, p.id AS page_id, p.job_id,
               j.review_flags AS flags, j.confidence, j.engine, j.result_key, j.annotated_key, j.finished_at
        FROM jobs j JOIN pages p ON p.job_id = j.id JOIN documents d ON d.id = p.document_id
             JOIN ingests i ON i.id = p.ingest_id
        WHERE j.needs_review AND j.status = 'succeeded'
    """)


def downgrade() -> None:
    op.execute("DROP VIEW review_queue")
    for view in _VIEWS:
        op.execute(f"DROP VIEW {view}")
    for table in ("ingests", "documents"):
        op.drop_column(table, "pages_review")
    op.drop_index("ix_jobs_review", "jobs")
    for column in ("confidence", "review_flags", "needs_review"):
        op.drop_column("jobs", column)
    _STATUS_VIEWS._create_views(op.get_bind().dialect.name)
