"""tenants, API keys and webhook deliveries; ingests belong to a tenant and know when they finished

Existing ingests have no tenant (they came from the command line) and are finished when every page is.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("webhook_secret", sa.String(100), nullable=False),
        sa.Column("created_at", _TS, nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("tenant_id", sa.String(36), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("interactive", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_at", _TS, nullable=False, server_default=sa.func.now()),
        sa.Column("revoked_at", _TS),
    )
    with op.batch_alter_table("ingests") as batch:
        batch.add_column(sa.Column("tenant_id", sa.String(36)))
        batch.add_column(sa.Column("api_key_id", sa.String(36)))
        batch.add_column(sa.Column("callback_url", sa.Text))
        batch.add_column(sa.Column("finished_at", _TS))
    op.create_index("ix_ingests_key_open", "ingests", ["api_key_id", "finished_at"])
    op.execute("UPDATE ingests SET finished_at = COALESCE(last_done_at, registered_at) "
               "WHERE registered_at IS NOT NULL AND pages_succeeded + pages_failed >= pages_total")
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("tenant_id", sa.String(36), nullable=False),
        sa.Column("ingest_id", sa.String(36), sa.ForeignKey("ingests.id"), nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("event", sa.String(40), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_at", _TS, nullable=False),
        sa.Column("delivered_at", _TS),
        sa.Column("given_up_at", _TS),
        sa.Column("last_status", sa.Integer),
        sa.Column("last_error", sa.Text),
        sa.Column("created_at", _TS, nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_webhooks_due", "webhook_deliveries", ["next_at"],
                    postgresql_where=sa.text("delivered_at IS NULL AND given_up_at IS NULL"),
                    sqlite_where=sa.text("delivered_at IS NULL AND given_up_at IS NULL"))
    op.create_table(
        "webhook_attempts",
        sa.Column("delivery_id", sa.String(36), sa.ForeignKey("webhook_deliveries.id"), primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True),
        sa.Column("at", _TS, nullable=False),
        sa.Column("status", sa.Integer),
        sa.Column("error", sa.Text),
        sa.Column("seconds", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("webhook_attempts")
    op.drop_index("ix_webhooks_due", "webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_index("ix_ingests_key_open", "ingests")
    for column in ("finished_at", "callback_url", "api_key_id", "tenant_id"):  # plain ALTER: keeps ingest_status
        op.drop_column("ingests", column)
    op.drop_table("api_keys")
    op.drop_table("tenants")
