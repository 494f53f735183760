"""Partitioned history on PostgreSQL: jobs, pages and results by month, and the retention that drops old months.

The tables that grow with pages are range-partitioned by their time-first id (``storage.timeids``): jobs and pages
by ``id``, results by ``job_id``. A lookup by id names its one partition, so status reads prune to it at planning
(or, through a join on the id, at execution). Each table has, in the schema ``paperlane_history``,

    <table>_legacy    ids made before time-first ids (uuid4/uuid5: below the mark), from migration 0010
    <table>_pYYYYMM   one month of time-first ids, created ahead of time by ``retain``
    <table>_ahead     everything above the newest month: stays empty while ``retain`` runs in time (the rows that
                      land there when it does not are moved into their month when it runs again)

``retain`` (``paperlane db retention``, a cron job) creates the months ahead and drops the months older than the
retention: a month's pages go once every ingest opened in it has finished; its jobs and results go once no page
left uses them (jobs are shared by content, across months). A month with work not finished is kept and said so.
Dropping detaches the partition ``CONCURRENTLY`` (readers and writers of the other months are not blocked) and
then drops it. SQLite (the embedded default) keeps one table each: there is nothing to do there.

Ingests, documents, usage and the job-key index stay unpartitioned: one row per ingest, per file, per tenant and
day, and per job key (the keys of dropped jobs are deleted with them).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, text

from paperlane.status import JobStatus
from paperlane.storage import timeids
from paperlane.storage.db import Database, utcnow

log = logging.getLogger(__name__)

# table -> its partition key; pages are dropped before the jobs they use, jobs with their results
TABLES = {"pages": "id", "results": "job_id", "jobs": "id"}
LEGACY, AHEAD = "legacy", "ahead"
SCHEMA = "paperlane_history"  # where the partitions live: the schema proper (public) holds the tables they make up
_UNFINISHED = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)


def month_start(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def add_months(month: datetime, n: int) -> datetime:
    index = month.year * 12 + month.month - 1 + n
    return month.replace(year=index // 12, month=index % 12 + 1)


def suffix(month: datetime) -> str:
    return f"p{month:%Y%m}"


def _month_of(name: str, table: str) -> datetime | None:
    tail = name.removeprefix(f"{table}_p")
    if len(tail) != 6 or not tail.isdigit():
        return None
    return datetime(int(tail[:4]), int(tail[4:]), 1, tzinfo=UTC)


def _bound(value: str | None, edge: str) -> str:
    return edge if value is None else f"'{value}'"


def _create(conn: Connection, table: str, name: str, lo: str | None, hi: str | None) -> None:
    conn.execute(text(f"CREATE TABLE {SCHEMA}.{table}_{name} PARTITION OF {table} "
                      f"FOR VALUES FROM ({_bound(lo, 'MINVALUE')}) TO ({_bound(hi, 'MAXVALUE')})"))


def create_layout(conn: Connection, table: str, first: datetime, months: int) -> None:
    """The partitions of a new partitioned ``table``: legacy below ``first``, ``months`` months from ``first``, and
    the one ahead of them (migration 0010)."""
    conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
    _create(conn, table, LEGACY, None, timeids.floor(first))
    for n in range(months):
        month = add_months(first, n)
        _create(conn, table, suffix(month), timeids.floor(month), timeids.floor(add_months(month, 1)))
    _create(conn, table, AHEAD, timeids.floor(add_months(first, months)), None)


def _partitions(conn: Connection, table: str) -> list[str]:
    return list(conn.scalars(text(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = :t ORDER BY c.relname"), {"t": table}))


def months(conn: Connection, table: str) -> list[datetime]:
    """The months ``table`` has partitions for, oldest first."""
    return sorted(m for name in _partitions(conn, table) if (m := _month_of(name, table)) is not None)


@dataclass
class Report:
    """What one retention run did: partitions created and dropped (with their rows), and kept (why)."""

    created: list[str] = field(default_factory=list)
    dropped: list[tuple[str, int]] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)

    def lines(self) -> list[str]:
        return ([f"created {name}" for name in self.created]
                + [f"dropped {name} ({rows} rows)" for name, rows in self.dropped]
                + [f"kept {name}: {why}" for name, why in self.kept])


def retain(db: Database, *, keep_days: int | None, ahead: int = 3, now: datetime | None = None) -> Report:
    """Create the months from the newest one to ``ahead`` months past now's; then, when ``keep_days`` is given, drop
    the months that ended more than that many days ago (legacy: when its newest row is that old), unless work in
    them is not finished. Does nothing on SQLite. A database error stops the run where it is (SQLAlchemy's own
    error); the next run carries on from there."""
    report = Report()
    if db.engine.dialect.name != "postgresql":
        return report
    now = now or utcnow()
    for table in TABLES:
        _create_ahead(db, table, month_start(now), ahead, report)
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        _finish_interrupted(conn, report)
        if keep_days is not None:
            cutoff = now - timedelta(days=keep_days)
            for name, lo, hi in _expired(conn, cutoff):
                _drop_month(conn, name, lo, hi, report)
    for line in report.lines():
        log.info("retention: %s", line)
    return report


def _finish_interrupted(conn: Connection, report: Report) -> None:
    """A detach ``CONCURRENTLY`` cut short (the run was killed) leaves its partition pending: finish and drop it."""
    pending = conn.execute(text(
        "SELECT p.relname, c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "JOIN pg_class p ON p.oid = i.inhparent "
        "WHERE i.inhdetachpending AND c.relnamespace = CAST(:schema AS regnamespace)"), {"schema": SCHEMA}).all()
    for parent, name in pending:
        conn.execute(text(f"ALTER TABLE {parent} DETACH PARTITION {SCHEMA}.{name} FINALIZE"))
        report.dropped.append((name, _drop_table(conn, name)))


def _create_ahead(db: Database, table: str, current: datetime, ahead: int, report: Report) -> None:
    with db.engine.connect() as conn:
        have = months(conn, table)
    month = add_months(have[-1], 1) if have else current
    while month <= add_months(current, ahead):
        with db.engine.begin() as conn:
            _split_ahead(conn, table, month)
        report.created.append(f"{table}_{suffix(month)}")
        month = add_months(month, 1)


def _split_ahead(conn: Connection, table: str, month: datetime) -> None:
    """Carve ``month`` out of the bottom of the ahead partition, in one short transaction: the ahead partition is
    detached, the month and a new ahead partition are made, and the rows the old one held are routed again."""
    lo, hi = timeids.floor(month), timeids.floor(add_months(month, 1))
    # It locks the table a moment: rather give up (the next run makes it) than queue every reader behind a long
    # transaction.
    conn.execute(text("SET LOCAL lock_timeout = '5s'"))
    conn.execute(text(f"ALTER TABLE {table} DETACH PARTITION {SCHEMA}.{table}_{AHEAD}"))
    conn.execute(text(f"ALTER TABLE {SCHEMA}.{table}_{AHEAD} RENAME TO {table}_{AHEAD}_split"))
    _create(conn, table, suffix(month), lo, hi)
    _create(conn, table, AHEAD, hi, None)
    conn.execute(text(f"INSERT INTO {table} SELECT * FROM {SCHEMA}.{table}_{AHEAD}_split"))
    conn.execute(text(f"DROP TABLE {SCHEMA}.{table}_{AHEAD}_split"))


def _expired(conn: Connection, cutoff: datetime) -> list[tuple[str, str | None, str]]:
    """(partition suffix, lowest id, id above) of the months past ``cutoff``, legacy first when its newest row is."""
    out: list[tuple[str, str | None, str]] = []
    every = sorted({m for table in TABLES for m in months(conn, table)})
    legacy = [f"{table}_{LEGACY}" for table in TABLES if f"{table}_{LEGACY}" in _partitions(conn, table)]
    newest = [conn.scalar(text(f"SELECT max(created_at) FROM {SCHEMA}.{name}")) for name in legacy]
    if legacy and all(at is None or at <= cutoff for at in newest) and any(at is not None for at in newest):
        out.append((LEGACY, None, _upper_bound(conn, legacy[0])))
    for month in every:
        if add_months(month, 1) <= cutoff:
            out.append((suffix(month), timeids.floor(month), timeids.floor(add_months(month, 1))))
    return out


def _upper_bound(conn: Connection, name: str) -> str:
    bound = conn.scalar(text("SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE oid = to_regclass(:n)"),
                        {"n": f"{SCHEMA}.{name}"})
    return str(bound).rsplit("TO ('", 1)[1].split("'", 1)[0]


def _range(column: str, lo: str | None) -> str:
    return f"{column} < :hi" if lo is None else f"{column} >= :lo AND {column} < :hi"


def _unfinished(conn: Connection, name: str, lo: str | None, hi: str) -> str | None:
    """Why the month's rows must stay (work in it not finished), or None."""
    ingests = conn.scalar(text(f"SELECT count(*) FROM ingests WHERE finished_at IS NULL AND {_range('id', lo)}"),
                          {"lo": lo, "hi": hi})
    if ingests:
        return f"{ingests} ingests opened then not finished"
    if f"jobs_{name}" in _partitions(conn, "jobs"):
        jobs = conn.scalar(text(f"SELECT count(*) FROM {SCHEMA}.jobs_{name} WHERE status = ANY(:live)"),
                           {"live": list(_UNFINISHED)})
        if jobs:
            return f"{jobs} jobs queued or running"
    return None


def _drop_month(conn: Connection, name: str, lo: str | None, hi: str, report: Report) -> None:
    why = _unfinished(conn, name, lo, hi)
    if why is not None:
        report.kept.append((name, why))
        return
    if f"pages_{name}" in _partitions(conn, "pages"):
        report.dropped.append((f"pages_{name}", _detach_and_drop(conn, "pages", f"pages_{name}")))
    if f"jobs_{name}" not in _partitions(conn, "jobs"):
        return
    used = f"SELECT 1 FROM pages WHERE {_range('job_id', lo)} LIMIT 1"
    if conn.scalar(text(used), {"lo": lo, "hi": hi}):
        report.kept.append((f"jobs_{name}", "its jobs are used by pages of a newer month"))
        return
    # Forget the keys first, so a registration from now on makes new jobs, then look again for one that came between.
    conn.execute(text(f"DELETE FROM job_keys WHERE {_range('job_id', lo)}"), {"lo": lo, "hi": hi})
    if conn.scalar(text(used), {"lo": lo, "hi": hi}):
        report.kept.append((f"jobs_{name}", "its jobs were just used by a new page"))
        return
    for table in ("results", "jobs"):
        if f"{table}_{name}" in _partitions(conn, table):
            report.dropped.append((f"{table}_{name}", _detach_and_drop(conn, table, f"{table}_{name}")))


def _detach_and_drop(conn: Connection, table: str, name: str) -> int:
    """Detach and drop ``name``; the legacy partition is made again, empty (ids of its shape are still written: the
    documents and pages of an ingest opened before time-first ids)."""
    hi = _upper_bound(conn, name) if name == f"{table}_{LEGACY}" else None
    conn.execute(text(f"ALTER TABLE {table} DETACH PARTITION {SCHEMA}.{name} CONCURRENTLY"))
    rows = _drop_table(conn, name)
    if hi is not None:
        _create(conn, table, LEGACY, None, hi)
    return rows


def _drop_table(conn: Connection, name: str) -> int:
    rows = conn.scalar(text(f"SELECT count(*) FROM {SCHEMA}.{name}"))
    conn.execute(text(f"DROP TABLE {SCHEMA}.{name}"))
    return int(rows or 0)
