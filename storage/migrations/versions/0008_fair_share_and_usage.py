"""fair share and metering: weights of tenants and ingests, a tenant's budgets, usage per tenant and day

Tenants get ``weight`` (1) and ``monthly_pages`` (none: no budget; their ``max_pages_in_flight`` is 0007's);
ingests get ``weight`` (1) and an index to find a tenant's unfinished ones. ``usage`` counts what each tenant
used per day (UTC), written with each page's final state from now on; the view ``tenant_usage`` adds the
tenant's name (NULL for the command line's ingests, tenant_id '').

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ALTER TABLE (no batch copy on SQLite), as 0004: the views on ingests stay as they are.
    op.add_column("tenants", sa.Column("weight", sa.Float, nullable=False, server_default="1"))
    op.add_column("tenants", sa.Column("monthly_pages", sa.Integer))
    op.add_column("ingests", sa.Column("weight", sa.Float, nullable=False, server_default="1"))
    op.create_index("ix_ingests_tenant_open", "ingests", ["tenant_id", "finished_at"])
    op.create_table(
        "usage",
        sa.Column("tenant_id", sa.String(36), primary_key=True),
        sa.Column("day", sa.Date, primary_key=True),
        sa.Column("pages_succeeded", sa.Integer, nullable=False),
        sa.Column("pages_failed", sa.Integer, nullable=False),
        sa.Column("pages_review", sa.Integer, nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
        sa.Column("completion_tokens", sa.BigInteger, nullable=False),
        sa.Column("engine_seconds", sa.Float, nullable=False),
    )
    op.execute("""
        CREATE VIEW tenant_usage AS
        SELECT u.day, u.tenant_id, t.name AS tenant, u.pages_succeeded + u.pages_failed AS pages,
               u.pages_succeeded, u.pages_failed, u.pages_review, u.prompt_tokens, u.completion_tokens,
               u.engine_seconds
        FROM usage u LEFT JOIN tenants t ON t.id = u.tenant_id
    """)


def downgrade() -> None:
    op.execute("DROP VIEW tenant_usage")
    op.drop_table("usage")
    op.drop_index("ix_ingests_tenant_open", "ingests")
    op.drop_column("ingests", "weight")
    for column in ("monthly_pages", "weight"):
        op.drop_column("tenants", column)
