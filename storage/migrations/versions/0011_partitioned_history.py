"""partitioned history: jobs, pages and results by month on PostgreSQL; one job per key kept by job_keys

jobs, pages and results are built again with their rows, on PostgreSQL as tables range-partitioned by id
(``storage.history``: results by job_id; the partitions in the schema paperlane_history): a legacy partition
below this month, which takes every row made before (their ids are uuid4/uuid5, below the time-first ids' mark),
this month and the next three, and one partition for everything above. A unique key on a partitioned table must hold the partition key, so
``uq_jobs_job_key`` becomes the table ``job_keys`` (job key -> job id, filled from the jobs), the unique
(document, page number) of pages a plain index (the page id is derived from both), and pages.job_id loses its
foreign key (jobs are shared across months; retention keeps a month's jobs while pages use them). SQLite gets
the same columns, keys and indexes in plain tables.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""

from __future__ import annotations

import importlib
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.schema import SchemaItem

from paperlane.status import JobStatus, state_sql, unpublished_sql
from paperlane.storage import history

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_V9 = importlib.import_module("paperlane.storage.migrations.versions.0009_pages_needing_review")
_VIEWS = ("review_queue", "ingest_status", "document_status", "page_status")
_PK = {"jobs": "id", "pages": "id", "results": "job_id"}
_AHEAD = 3  # months made after this one; ``paperlane db retention`` makes the later ones


def _indexes(partitioned: bool) -> dict[str, list[tuple[str, list[str], str | None]]]:
    """Each table's indexes as (name, columns, partial predicate), as they are after (``partitioned``) or before."""
    running, failed = state_sql("status", JobStatus.RUNNING), state_sql("status", JobStatus.FAILED)
    pages: list[tuple[str, list[str], str | None]] = [("ix_pages_job", ["job_id"], None),
                                                      ("ix_pages_ingest", ["ingest_id"], None)]
    if partitioned:
        pages.append(("ix_pages_document_page", ["document_id", "page_no"], None))
    return {
        "jobs": [("ix_jobs_status_lane", ["status", "lane"], None),
                 ("ix_jobs_content_sha256", ["content_sha256"], None), ("ix_jobs_running", ["id"], running),
                 ("ix_jobs_unpublished", ["id"], unpublished_sql("status", "enqueued_at")),
                 ("ix_jobs_failed", ["id"], failed), ("ix_jobs_review", ["id"], "needs_review")],
        "pages": pages,
        "results": [("ix_results_content_sha256", ["content_sha256"], None)],
    }


def upgrade() -> None:
    _rebuild(partitioned=True)
    op.create_table("job_keys", sa.Column("job_key", sa.String(64), primary_key=True),
                    sa.Column("job_id", sa.String(36), nullable=False))
    op.execute("INSERT INTO job_keys (job_key, job_id) SELECT job_key, id FROM jobs")
    op.create_index("ix_job_keys_job_id", "job_keys", ["job_id"])


def downgrade() -> None:
    op.drop_table("job_keys")
    _rebuild(partitioned=False)


def _rebuild(*, partitioned: bool) -> None:
    """jobs, pages and results made again with their rows: partitioned (PostgreSQL) with the keys partitions allow,
    or plain with the keys of 0009; the views that read them dropped and made again."""
    bind = op.get_bind()
    pg = bind.dialect.name == "postgresql"
    for view in _VIEWS:
        op.execute(f"DROP VIEW {view}")
    for table, pk in _PK.items():
        _move_aside(bind, table, pg)
        columns = sa.Table(f"{table}_before", sa.MetaData(), autoload_with=bind).columns
        new = [sa.Column(c.name, c.type, nullable=c.nullable, primary_key=c.name == pk, server_default=_default(c))
               for c in columns]
        by: dict[str, Any] = {"postgresql_partition_by": f"RANGE ({pk})"} if pg and partitioned else {}
        op.create_table(table, *new, *_constraints(table, partitioned), **by)
        if pg and partitioned:
            history.create_layout(bind, table, history.month_start(bind.scalar(sa.text("SELECT now()"))), _AHEAD + 1)
        names = ", ".join(c.name for c in columns)
        op.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM {table}_before")
    for table in ("pages", "results", "jobs"):
        op.drop_table(f"{table}_before")
    for table, indexes in _indexes(partitioned).items():
        for name, cols, where in indexes:
            predicate: dict[str, Any] = ({} if where is None else
                                         {"postgresql_where": sa.text(where), "sqlite_where": sa.text(where)})
            op.create_index(name, table, cols, **predicate)
    if pg and not partitioned:
        op.execute(f"DROP SCHEMA IF EXISTS {history.SCHEMA}")
    _V9.create_views()


def _move_aside(bind: sa.Connection, table: str, pg: bool) -> None:
    """Rename ``table`` to <table>_before; on PostgreSQL its primary key's index too, whose name the new one takes."""
    op.rename_table(table, f"{table}_before")
    if pg:
        pk = sa.inspect(bind).get_pk_constraint(f"{table}_before")["name"]
        op.execute(f"ALTER TABLE {table}_before RENAME CONSTRAINT {pk} TO {table}_before_pkey")


def _default(column: sa.Column[Any]) -> sa.TextClause | None:
    """A reflected column's server default, to give the column made again."""
    arg = getattr(column.server_default, "arg", None)
    return None if arg is None else sa.text(str(getattr(arg, "text", arg)))


def _constraints(table: str, partitioned: bool) -> list[SchemaItem]:
    if table == "pages":
        keys: list[SchemaItem] = [sa.ForeignKeyConstraint(["document_id"], ["documents.id"])]
        if not partitioned:
            keys += [sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
                     sa.UniqueConstraint("document_id", "page_no", name="uq_pages_document_page")]
        return keys
    if table == "jobs" and not partitioned:
        return [sa.UniqueConstraint("job_key", name="uq_jobs_job_key")]
    return []
