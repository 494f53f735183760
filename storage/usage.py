"""What each tenant used, per day (UTC): pages by outcome, pages flagged for review, engine tokens and seconds.

Counted in the same transaction as the state it counts, by the writes that move a page's job in the counts of
its documents and ingests (``ingests.rollup``, and registration for a page whose job was final already): a page
counts once, when it becomes final (a job shared by several pages counts per page); a page that stops being final
(queued again) leaves the count, and counts again when it is final again. Retries, a worker killed mid-page and a
redelivered message move nothing: only a job's move into a final state does. The engine work (tokens from the
engine's usage report, seconds of inference) is counted with the job's move into its final state, once per job,
from the attempt that got it there: an answer kept from an earlier attempt (``workers.answers``) is counted
once, with the attempt that used it. Pages needing review are counted when they succeed, where the result says
so (``quality.needs_review``). The command line's ingests count under tenant ``""``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from sqlalchemy import Table, bindparam, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from paperlane.schemas import PageResult, Stage
from paperlane.storage.db import Database, utcnow
from paperlane.storage.tables import IngestRow, TenantRow, UsageRow

NO_TENANT = ""
_USAGE: Table = UsageRow.__table__
_COUNTS = ("pages_succeeded", "pages_failed", "pages_review", "prompt_tokens", "completion_tokens", "engine_seconds")


@dataclass(frozen=True)
class EngineWork:
    """What the engine spent on a job's final attempt, and whether its result needs a person to check it."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    review: bool = False

    @classmethod
    def of(cls, result: PageResult, timings: dict[str, float] | None = None) -> EngineWork:
        """From a result (its usage report; ``quality.needs_review`` where results carry it) and its timings."""
        used = result.usage
        quality = getattr(result, "quality", None)
        return cls(prompt_tokens=used.prompt_tokens if used else 0, completion_tokens=used.completion_tokens if used
                   else 0, seconds=float((timings or result.timings).get(Stage.INFERENCE.value) or 0.0),
                   review=getattr(quality, "needs_review", None) is True)


def tenant_pages(per_ingest: Any) -> Any:
    """(tenant, pages) of a job's pages: ``per_ingest`` selects (ingest_id, n) for them; for ``count``."""
    i = IngestRow.__table__.c
    tenant = func.coalesce(i.tenant_id, NO_TENANT)
    return (select(tenant, func.sum(per_ingest.c.n))
            .select_from(per_ingest.join(IngestRow.__table__, i.id == per_ingest.c.ingest_id))
            .group_by(tenant).order_by(tenant))


def count(s: Session, pages: Any, params: dict[str, Any], *, succeeded: int, failed: int, now: datetime,
          work: EngineWork | None = None) -> None:
    """Add a job's pages to their tenants' day: ``pages`` (``tenant_pages``, executed with ``params``) selects
    (tenant, n) for its pages; ``succeeded`` and ``failed`` move each page (-1, 0, +1), ``work`` the engine work of
    the move into a final state (counted for the job once, with its first tenant)."""
    for k, (tenant_id, n) in enumerate(s.execute(pages, params).all()):
        pages_n = int(n or 0)
        counts: dict[str, float] = {"pages_succeeded": succeeded * pages_n, "pages_failed": failed * pages_n}
        if work is not None:
            counts["pages_review"] = pages_n if work.review and succeeded > 0 else 0
            if k == 0:
                counts.update(prompt_tokens=work.prompt_tokens, completion_tokens=work.completion_tokens,
                              engine_seconds=work.seconds)
        add(s, tenant_id, now, **counts)


def add(s: Session, tenant_id: str | None, now: datetime, **counts: float) -> None:
    """Add ``counts`` (columns of ``usage``) to the tenant's row of ``now``'s day."""
    if not any(counts.values()):
        return
    values = {c: counts.get(c, 0) for c in _COUNTS}
    stmt = _upsert(s.get_bind().dialect.name, frozenset(c for c in values if values[c]))
    s.execute(stmt, {"tenant_id": tenant_id or NO_TENANT, "day": now.date(), **values})


@functools.cache
def _upsert(dialect: str, adding: frozenset[str]) -> Any:
    """The statement ``add`` runs, built once for each set of columns it adds to."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(_USAGE).values(tenant_id=bindparam("tenant_id", type_=_USAGE.c.tenant_id.type),
                                 day=bindparam("day", type_=_USAGE.c.day.type),
                                 **{c: bindparam(c, type_=_USAGE.c[c].type) for c in _COUNTS})
    return stmt.on_conflict_do_update(index_elements=["tenant_id", "day"],
                                      set_={c: _USAGE.c[c] + stmt.excluded[c] for c in _COUNTS if c in adding})


# --- reads --------------------------------------------------------------------------------------------


def month_start(at: datetime) -> date:
    return at.date().replace(day=1)


def next_month(at: datetime) -> date:
    """The first day of the month after ``at``'s: when a monthly budget starts again."""
    first = month_start(at)
    return first.replace(year=first.year + 1, month=1) if first.month == 12 else first.replace(month=first.month + 1)


@dataclass(frozen=True)
class Budget:
    """A tenant's monthly page budget: ``limit`` (None: none), pages ``used`` this month (final, and registered
    but not final yet), and the day it starts again."""

    limit: int | None
    used: int
    resets: date

    @property
    def exhausted(self) -> bool:
        return self.limit is not None and self.used >= self.limit


def budget(db: Database, tenant_id: str, *, now: datetime | None = None) -> Budget:
    """The tenant's monthly budget and what it used of it (from the usage rows and its unfinished ingests)."""
    now = now or utcnow()
    i, u = IngestRow.__table__.c, _USAGE.c
    with db.session() as s:
        limit = s.scalar(select(TenantRow.monthly_pages).where(TenantRow.id == tenant_id))
        if limit is None:
            return Budget(None, 0, next_month(now))
        final = s.scalar(select(func.coalesce(func.sum(u.pages_succeeded + u.pages_failed), 0))
                         .where(u.tenant_id == tenant_id, u.day >= month_start(now)))
        open_ = s.scalar(select(func.coalesce(func.sum(i.pages_total - i.pages_succeeded - i.pages_failed), 0))
                         .where(i.tenant_id == tenant_id, i.finished_at.is_(None)))
    return Budget(int(limit), int(final or 0) + int(open_ or 0), next_month(now))


@dataclass(frozen=True)
class UsageDay:
    day: date
    tenant_id: str
    tenant: str | None  # None: the command line's ingests
    pages_succeeded: int
    pages_failed: int
    pages_review: int
    prompt_tokens: int
    completion_tokens: int
    engine_seconds: float

    @property
    def pages(self) -> int:
        return self.pages_succeeded + self.pages_failed

    def as_dict(self) -> dict[str, Any]:
        return {"day": self.day.isoformat(), "tenant": self.tenant, "pages": self.pages,
                **{c: round(getattr(self, c), 3) if c == "engine_seconds" else getattr(self, c) for c in _COUNTS}}


def days(db: Database, *, since: date, tenant_id: str | None = None) -> list[UsageDay]:
    """Usage per tenant and day from ``since`` on (one tenant's, given ``tenant_id``), by day then tenant."""
    u = _USAGE.c
    query = (select(u.day, u.tenant_id, TenantRow.name, *(u[c] for c in _COUNTS))
             .select_from(_USAGE.outerjoin(TenantRow.__table__, TenantRow.id == u.tenant_id))
             .where(u.day >= since).order_by(u.day, TenantRow.name))
    if tenant_id is not None:
        query = query.where(u.tenant_id == tenant_id)
    with db.session() as s:
        return [UsageDay(r[0], r[1], r[2], int(r[3]), int(r[4]), int(r[5]), int(r[6]), int(r[7]), float(r[8]))
                for r in s.execute(query)]


def totals(rows: list[UsageDay]) -> dict[str, Any]:
    """The sum of ``rows`` (pages, tokens, seconds)."""
    out: dict[str, Any] = {"pages": sum(r.pages for r in rows)}
    for c in _COUNTS:
        out[c] = sum(getattr(r, c) for r in rows)
    out["engine_seconds"] = round(out["engine_seconds"], 3)
    return out


def top_tenants(db: Database, *, since: date, limit: int) -> dict[str, str]:
    """The ``limit`` tenants with the most pages since ``since``: id -> name."""
    u = _USAGE.c
    pages = func.sum(u.pages_succeeded + u.pages_failed)
    with db.session() as s:
        rows = s.execute(select(u.tenant_id, TenantRow.name).join(TenantRow, TenantRow.id == u.tenant_id)
                         .where(u.day >= since).group_by(u.tenant_id, TenantRow.name)
                         .order_by(pages.desc()).limit(limit)).all()
    return {tenant_id: name for tenant_id, name in rows}
