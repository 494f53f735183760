"""Alembic environment: runs migrations on the connection paperlane hands it."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from paperlane.storage.tables import Base

# Any fixed number: serialises concurrent upgrades (several workers starting at once) on PostgreSQL.
_MIGRATION_LOCK = 0x7061706572


def run_migrations_online() -> None:
    connection = context.config.attributes["connection"]
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
    with context.begin_transaction():
        context.run_migrations()


run_migrations_online()
