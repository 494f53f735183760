"""a tenant's pages reserved this month: the counter its monthly budget is reserved from, in the same conditional
UPDATE as its pages in flight (storage.tenants.PageBudget.reserve), so replicas cannot overspend it between them

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tenants", sa.Column("month_start", sa.Date))
    op.add_column("tenants", sa.Column("month_pages", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    for column in ("month_pages", "month_start"):
        op.drop_column("tenants", column)
