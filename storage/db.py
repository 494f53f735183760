"""The database: PostgreSQL in production, SQLite embedded. SQLAlchemy 2 + Alembic.

``Database`` owns the engine, a session factory and the migrations; a session's connection failures
become ``StorageUnavailable`` here, at the boundary. ``get_row`` reads one row by its key or raises the
``NotFound`` that names what is missing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from paperlane.errors import NotFound, StorageUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

_MIGRATIONS = Path(__file__).with_name("migrations")


def head_revision() -> str:
    """The newest migration's revision: its file's number (``0011_partitioned_history.py`` is ``0011``, a chain
    with no branches; a test holds this to Alembic's own head), read without importing Alembic."""
    return max(p.name.split("_", 1)[0] for p in (_MIGRATIONS / "versions").glob("[0-9]*_*.py"))


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every timestamp paperlane writes is UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def _sqlite_pragmas(dbapi_conn: Any, _record: object) -> None:  # the DBAPI connection (sqlite3's): untyped
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def _serial_plans(dbapi_conn: Any, _record: object) -> None:  # psycopg2's connection: untyped
    """No parallel plans: paperlane's statements are lookups by key that finish in a millisecond, and PostgreSQL
    plans a status count over a big ingest in parallel, whose workers take 5-15 ms to start on a busy host
    (benchmarks/status_scale.py: an ingest's lookup at 10M pages, 0.2 ms of work in 14 ms)."""
    autocommit, dbapi_conn.autocommit = dbapi_conn.autocommit, True  # a rollback of the first use must not undo it
    cur = dbapi_conn.cursor()
    cur.execute("SET max_parallel_workers_per_gather = 0")
    cur.close()
    dbapi_conn.autocommit = autocommit


class Database:
    """A connection pool and session factory for one database URL."""

    def __init__(self, url: str, *, pool_size: int = 5, echo: bool = False) -> None:
        self.url = url
        if url.startswith("sqlite"):
            path = url.split("///", 1)[-1]
            if path and path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.engine: Engine = create_engine(url, echo=echo, connect_args={"timeout": 30})
            event.listen(self.engine, "connect", _sqlite_pragmas)
        else:
            self.engine = create_engine(url, echo=echo, pool_size=pool_size, pool_pre_ping=True)
            event.listen(self.engine, "connect", _serial_plans)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def upgrade(self) -> None:
        """Bring the schema to the newest migration. Safe to run from several processes at once. A database at
        the newest already costs two small queries: every command's start (``paperlane submit`` included) runs this, and
        Alembic's import and its reading of every migration cost ~0.5 s of CPU, 5% of a 10,000-page submit."""
        try:
            with self.engine.connect() as conn:
                if (inspect(conn).has_table("alembic_version") and conn.execute(
                        text("SELECT version_num FROM alembic_version")).scalar() == head_revision()):
                    return
            self.migrate("head")
        except (OperationalError, DBAPIError) as exc:
            raise StorageUnavailable(f"database unreachable: {_short(exc)}", stage="store") from exc

    def migrate(self, revision: str, *, down: bool = False) -> None:
        """Alembic's migrations up to ``revision`` (or ``down`` to it: ``-1`` is one back), in one transaction."""
        from alembic import command  # imported only when there is something to migrate (``upgrade``)
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(_MIGRATIONS))
        with self.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            (command.downgrade if down else command.upgrade)(cfg, revision)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in a transaction, committed on success; DB failures become StorageUnavailable."""
        try:
            with self._sessions.begin() as session:
                yield session
        except (OperationalError, DBAPIError) as exc:
            if getattr(exc, "connection_invalidated", False) or isinstance(exc, OperationalError):
                raise StorageUnavailable(f"database unreachable: {_short(exc)}", stage="store") from exc
            raise

    def dispose(self) -> None:
        self.engine.dispose()


def get_row(session: Session, table: type[T], row_id: str, missing: type[NotFound]) -> T:
    """The row of ``table`` with this primary key. Raises ``missing`` (a NotFound) when there is none."""
    row = session.get(table, row_id)
    if row is None:
        raise missing(row_id)
    return row


def _short(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", exc)) or type(exc).__name__
    return text.strip().splitlines()[0][:200]
