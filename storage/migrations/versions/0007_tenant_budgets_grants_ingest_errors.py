"""tenants' pages in flight (a reserved budget) and its override, S3 ingest grants per tenant, an ingest's error

``tenants.pages_in_flight`` starts as the pages of each tenant's unfinished ingests that are not final yet; from
then on registration reserves into it and the writes that make pages final release from it.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    # Plain ALTER TABLE (no batch copy on SQLite), as 0004: ingests has views on it.
    op.add_column("tenants", sa.Column("pages_in_flight", sa.Integer, nullable=False, server_default="0"))
    op.add_column("tenants", sa.Column("max_pages_in_flight", sa.Integer))
    op.add_column("ingests", sa.Column("error", sa.Text))
    op.execute("UPDATE tenants SET pages_in_flight = (SELECT COALESCE(SUM(i.pages_total - i.pages_succeeded "
               "- i.pages_failed), 0) FROM ingests i WHERE i.tenant_id = tenants.id AND i.finished_at IS NULL)")
    op.create_table(
        "ingest_grants",
        sa.Column("tenant_id", sa.String(36), sa.ForeignKey("tenants.id"), primary_key=True),
        sa.Column("bucket", sa.String(255), primary_key=True),
        sa.Column("prefix", sa.String(1024), primary_key=True),
        sa.Column("created_at", _TS, nullable=False, server_default=sa.func.now()),
    )


def downgrade() -> None:
    op.drop_table("ingest_grants")
    op.drop_column("ingests", "error")
    op.drop_column("tenants", "max_pages_in_flight")
    op.drop_column("tenants", "pages_in_flight")
