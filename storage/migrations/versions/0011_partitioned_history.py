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
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.schema import SchemaItem


revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_V9 = importlib.import_module("paperlane.storage.migrations.versions.0009_pages_needing_review")
_VIEWS = ("review_queue", "ingest_status", "document_status", "page_status")
_PK = {"jobs": "id", "pages": "id", "results": "job_id"}
_AHEAD = 3  # months made after this one; ``paperlane db retention`` makes the later ones

# As this migration was written (a migration must not change when the code does): storage.history's partition
# layout and storage.timeids' bounds, paperlane.status's words.
_SCHEMA = "paperlane_history"
_RUNNING, _FAILED = "status = 'running'", "status = 'failed'"
_UNPUBLISHED = "status = 'queued' AND enqueued_at IS NULL"


def _floor(at: datetime) -> str:
    """The lowest time-first id made at ``at`` or later: "ffff", the milliseconds in 12 hex digits, zeros."""
    digits = f"ffff{int(at.timestamp() * 1000):012x}" + "0" * 16
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:32]}"


def _add_months(month: datetime, n: int) -> datetime:
    index = month.year * 12 + month.month - 1 + n
    return month.replace(year=index // 12, month=index % 12 + 1)


def _partition(bind: sa.Connection, table: str, name: str, lo: str | None, hi: str | None) -> None:
    low, high = ("MINVALUE" if lo is None else f"'{lo}'"), ("MAXVALUE" if hi is None else f"'{hi}'")
    bind.execute(sa.text(f"CREATE TABLE {_SCHEMA}.{table}_{name} PARTITION OF {table} FOR VALUES FROM ({low}) "
                         f"TO ({high})"))


def _create_layout(bind: sa.Connection, table: str, months: int) -> None:
    """The partitions of a new partitioned ``table``: legacy below this month, ``months`` months from it, ahead."""
    first = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    bind.execute(sa.text(f"CREATE SCHEMA IF NOT EXISTS {_SCHEMA}"))
    _partition(bind, table, "legacy", None, _floor(first))
    for n in range(months):
        month = _add_months(first, n)
        _partition(bind, table, f"p{month:%Y%m}", _floor(month), _floor(_add_months(month, 1)))
    _partition(bind, table, "ahead", _floor(_add_months(first, months)), None)


def _indexes(partitioned: bool) -> dict[str, list[tuple[str, list[str], str | None]]]:
    """Each table's indexes as (name, columns, partial predicate), as they are after (``partitioned``) or before."""
    running, failed = _RUNNING, _FAILED
    pages: list[tuple[str, list[str], str | None]] = [("ix_pages_job", ["job_id"], None),
                                                      ("ix_pages_ingest", ["ingest_id"], None)]
    if partitioned:
        pages.append(("ix_pages_document_page", ["document_id", "page_no"], None))
    return {
        "jobs": [("ix_jobs_status_lane", ["status", "lane"], None),
                 ("ix_jobs_content_sha256", ["content_sha256"], None), ("ix_jobs_running", ["id"], running),
                 ("ix_jobs_unpublished", ["id"], _UNPUBLISHED),
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
            _create_layout(bind, table, _AHEAD + 1)
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
        op.execute(f"DROP SCHEMA IF EXISTS {_SCHEMA}")
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
