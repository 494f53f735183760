"""Tenants, their API keys, their budget of pages in flight and the S3 prefixes they may ingest.

A key is ``pl_`` and 43 random URL-safe characters (256 bits), shown once when it is made; the database
keeps its sha256 only (a key this random needs no slow hash: nothing can be guessed from the digest), and
its first characters to tell keys apart in lists. A tenant's webhook secret signs what it receives.

A tenant's pages in flight are a counter on its row: registration reserves a document's pages from it before
they are stored (``PageBudget.reserve``: one conditional UPDATE, so parallel uploads cannot all pass), and the
transactions that make pages final release them (``storage.ingests``). A tenant's limits (``paperlane tenants
set``): its weight in each lane's fair share (1), a monthly page budget (none) and a pages-in-flight budget (none:
the setting ``api.max_pages_in_flight``).
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from typing import Any

from datetime import datetime

from sqlalchemy import case, delete, func, or_, select, update
from sqlalchemy.orm import Session

from paperlane.errors import MonthlyBudgetUsed, OverBudget, TenantNotFound, UsageError
from paperlane.schemas import check_weight
from paperlane.storage.db import Database, utcnow
from paperlane.storage.tables import ApiKeyRow, IngestGrantRow, TenantRow
from paperlane.storage.usage import month_start

KEY_PREFIX = "pl_"


@dataclass(frozen=True)
class Caller:
    """Who an API request comes from."""

    key_id: str
    tenant_id: str
    tenant: str
    interactive: bool


@dataclass
class NewKey:
    key: str  # shown once
    key_id: str
    tenant_id: str
    tenant_created: bool
    webhook_secret: str


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(db: Database, *, tenant: str, interactive: bool = False) -> NewKey:
    """A new key for ``tenant`` (made if it does not exist yet)."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    with db.session() as s:
        row = s.scalars(select(TenantRow).where(TenantRow.name == tenant)).one_or_none()
        created = row is None
        if row is None:
            row = TenantRow(id=str(uuid.uuid4()), name=tenant, webhook_secret=secrets.token_hex(32),
                            created_at=utcnow(), weight=1.0)
            s.add(row)
            s.flush()
        api_key = ApiKeyRow(id=str(uuid.uuid4()), tenant_id=row.id, key_hash=hash_key(key), prefix=key[:10],
                            interactive=interactive, created_at=utcnow())
        s.add(api_key)
        return NewKey(key, api_key.id, row.id, created, row.webhook_secret)


def authenticate(db: Database, key: str) -> Caller | None:
    """The caller a key belongs to, or None for an unknown or revoked key."""
    if not key.startswith(KEY_PREFIX) or len(key) > 200:
        return None
    with db.session() as s:
        found = s.execute(select(ApiKeyRow.id, ApiKeyRow.interactive, TenantRow.id, TenantRow.name)
                          .join(TenantRow, TenantRow.id == ApiKeyRow.tenant_id)
                          .where(ApiKeyRow.key_hash == hash_key(key), ApiKeyRow.revoked_at.is_(None))).one_or_none()
    if found is None:
        return None
    key_id, interactive, tenant_id, tenant = found
    return Caller(key_id=key_id, tenant_id=tenant_id, tenant=tenant, interactive=bool(interactive))


def key_active(db: Database, key_id: str) -> bool:
    """Whether the key ``key_id`` exists and is not revoked."""
    with db.session() as s:
        return s.scalar(select(ApiKeyRow.id).where(ApiKeyRow.id == key_id, ApiKeyRow.revoked_at.is_(None))) is not None


def list_keys(db: Database, tenant: str | None = None) -> list[tuple[ApiKeyRow, str]]:
    """Keys (with their tenant's name), newest first."""
    with db.session() as s:
        query = (select(ApiKeyRow, TenantRow.name).join(TenantRow, TenantRow.id == ApiKeyRow.tenant_id)
                 .order_by(ApiKeyRow.created_at.desc()))
        if tenant is not None:
            query = query.where(TenantRow.name == tenant)
        return [(k, name) for k, name in s.execute(query)]


def revoke_key(db: Database, prefix: str) -> int:
    """Revoke the key ``prefix`` is (the whole key), or the keys starting with it (its first 8 to 10 characters,
    matched literally); how many were revoked."""
    if len(prefix) < 8:
        raise UsageError("give at least the first 8 characters of the key")
    k = ApiKeyRow
    which = (k.key_hash == hash_key(prefix) if len(prefix) > 16
             else func.substr(k.prefix, 1, len(prefix[:10])) == prefix[:10])
    with db.session() as s:
        done = s.execute(update(k).where(which, k.revoked_at.is_(None)).values(revoked_at=utcnow()))
        return int(done.rowcount or 0)


def rotate_webhook_secret(db: Database, tenant: str) -> str:
    """A new webhook signing secret for ``tenant``: every delivery from now on is signed with it."""
    secret = secrets.token_hex(32)
    with db.session() as s:
        done = s.execute(update(TenantRow).where(TenantRow.name == tenant).values(webhook_secret=secret))
    if not done.rowcount:
        raise UsageError(f"no tenant called {tenant}")
    return secret


def webhook_secret(db: Database, tenant_id: str) -> str:
    with db.session() as s:
        secret = s.scalar(select(TenantRow.webhook_secret).where(TenantRow.id == tenant_id))
    if secret is None:
        raise TenantNotFound(tenant_id)
    return secret


def _tenant_id(s: Session, tenant: str) -> str:
    found = s.scalar(select(TenantRow.id).where(TenantRow.name == tenant))
    if found is None:
        raise UsageError(f"no tenant called {tenant}")
    return str(found)


# --- pages in flight ----------------------------------------------------------------------------------------


class PageBudget:
    """A tenant's pages in flight (at most its own ``max_pages_in_flight``, or ``default_cap``) and its pages this
    month (at most its ``monthly_pages``), reserved together in one conditional UPDATE: whichever API replica or
    thread reserves, the database's row lock orders them and each sees the others' reservations."""

    def __init__(self, db: Database, tenant_id: str, *, default_cap: int) -> None:
        self.db, self.tenant_id, self.default_cap = db, tenant_id, default_cap

    def reserve(self, pages: int, *, now: datetime | None = None) -> None:
        """Reserve ``pages`` more, in flight and this month. Raises OverBudget (retryable unless ``pages`` is more
        than the whole budget), MonthlyBudgetUsed."""
        t, month = TenantRow, month_start(now or utcnow())
        cap = func.coalesce(t.max_pages_in_flight, self.default_cap)
        used = case((t.month_start == month, t.month_pages), else_=0)
        with self.db.session() as s:
            done = s.execute(update(t).where(t.id == self.tenant_id, t.pages_in_flight + pages <= cap,
                                             or_(t.monthly_pages.is_(None), used + pages <= t.monthly_pages))
                             .values(pages_in_flight=t.pages_in_flight + pages, month_pages=used + pages,
                                     month_start=month))
            if done.rowcount:
                return
            found = s.execute(select(t.monthly_pages, used).where(t.id == self.tenant_id)).one_or_none()
        if found is not None and found[0] is not None and found[1] + pages > found[0]:
            raise MonthlyBudgetUsed(asked=pages, used=int(found[1]), limit=int(found[0]))
        in_flight, limit = self.room()
        raise OverBudget(asked=pages, in_flight=in_flight, cap=limit)

    def release(self, pages: int, *, now: datetime | None = None) -> None:
        """Give back ``pages`` reserved and never registered (to this month's count too, when reserved in it)."""
        t, month = TenantRow, month_start(now or utcnow())
        with self.db.session() as s:
            s.execute(update(t).where(t.id == self.tenant_id).values(
                pages_in_flight=t.pages_in_flight - pages,
                month_pages=case((t.month_start == month, t.month_pages - pages), else_=t.month_pages)))

    def month(self, *, now: datetime | None = None) -> int:
        """The pages reserved this month."""
        t = TenantRow
        with self.db.session() as s:
            found = s.scalar(select(case((t.month_start == month_start(now or utcnow()), t.month_pages), else_=0))
                             .where(t.id == self.tenant_id))
        return int(found or 0)

    def room(self) -> tuple[int, int]:
        """(pages in flight, the tenant's cap)."""
        t = TenantRow
        with self.db.session() as s:
            found = s.execute(select(t.pages_in_flight, func.coalesce(t.max_pages_in_flight, self.default_cap))
                              .where(t.id == self.tenant_id)).one_or_none()
        if found is None:
            raise TenantNotFound(self.tenant_id)
        return int(found[0]), int(found[1])


# --- S3 ingest grants ---------------------------------------------------------------------------------------


def grant_prefix(prefix: str) -> str:
    """A grant's prefix as stored: "" (the whole bucket) or a folder, ending in "/"."""
    prefix = prefix.lstrip("/")
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def grant_ingest(db: Database, tenant: str, bucket: str, prefix: str) -> str:
    """Let ``tenant`` ingest the objects of ``bucket`` under ``prefix``; the prefix as stored."""
    prefix = grant_prefix(prefix)
    with db.session() as s:
        tenant_id = _tenant_id(s, tenant)
        if s.get(IngestGrantRow, (tenant_id, bucket, prefix)) is None:
            s.add(IngestGrantRow(tenant_id=tenant_id, bucket=bucket, prefix=prefix, created_at=utcnow()))
    return prefix


def revoke_grant(db: Database, tenant: str, bucket: str, prefix: str) -> int:
    """Withdraw a grant; how many were withdrawn (0 or 1)."""
    with db.session() as s:
        tenant_id = _tenant_id(s, tenant)
        done = s.execute(delete(IngestGrantRow).where(IngestGrantRow.tenant_id == tenant_id,
                                                      IngestGrantRow.bucket == bucket,
                                                      IngestGrantRow.prefix == grant_prefix(prefix)))
        return int(done.rowcount or 0)


def list_grants(db: Database, tenant: str | None = None) -> list[tuple[str, str, str]]:
    """(tenant, bucket, prefix) of every grant, or of one tenant's."""
    g = IngestGrantRow
    query = (select(TenantRow.name, g.bucket, g.prefix).join(TenantRow, TenantRow.id == g.tenant_id)
             .order_by(TenantRow.name, g.bucket, g.prefix))
    if tenant is not None:
        query = query.where(TenantRow.name == tenant)
    with db.session() as s:
        return [(str(n), str(b), str(p)) for n, b, p in s.execute(query)]


def granted(db: Database, tenant_id: str) -> list[tuple[str, str]]:
    """(bucket, prefix) of every grant of ``tenant_id``."""
    g = IngestGrantRow
    with db.session() as s:
        return [(str(b), str(p)) for b, p in s.execute(select(g.bucket, g.prefix).where(g.tenant_id == tenant_id))]


def covers(grants: list[tuple[str, str]], bucket: str, prefix: str) -> bool:
    """Whether one of ``grants`` covers every object ``s3://bucket/prefix`` lists: the prefix (as a folder) lies in
    a granted folder. Compared literally: no LIKE pattern."""
    wanted = prefix.lstrip("/") + "/"
    return any(b == bucket and wanted.startswith(p) for b, p in grants)


def may_ingest(db: Database, tenant_id: str, bucket: str, prefix: str) -> bool:
    """Whether a grant of ``tenant_id`` covers ``s3://bucket/prefix`` (``covers``)."""
    return covers(granted(db, tenant_id), bucket, prefix)
@dataclass(frozen=True)
class TenantLimits:
    tenant_id: str
    name: str
    weight: float
    monthly_pages: int | None  # None: no monthly budget
    max_pages_in_flight: int | None  # None: the setting


_LIMITS = ("weight", "monthly_pages", "max_pages_in_flight")


def set_limits(db: Database, tenant: str, **changes: Any) -> TenantLimits:
    """Change the named tenant's ``weight``, ``monthly_pages`` or ``max_pages_in_flight`` (None clears a budget);
    its limits after. Raises TenantNotFound, UsageError for a value out of range."""
    unknown = set(changes) - set(_LIMITS)
    if unknown:
        raise UsageError(f"not a tenant limit: {', '.join(sorted(unknown))}")
    if "weight" in changes:
        check_weight(changes["weight"])
    for name in ("monthly_pages", "max_pages_in_flight"):
        if changes.get(name) is not None and changes[name] < 0:
            raise UsageError(f"{name.replace('_', ' ')} cannot be negative")
    with db.session() as s:
        row = s.scalars(select(TenantRow).where(TenantRow.name == tenant)).one_or_none()
        if row is None:
            raise TenantNotFound(tenant)
        for name, value in changes.items():
            setattr(row, name, value)
        s.flush()
        return _limits(row)


def limits(db: Database, tenant: str | None = None) -> list[TenantLimits]:
    """Every tenant's limits (or the named one's), by name."""
    query = select(TenantRow).order_by(TenantRow.name)
    if tenant is not None:
        query = query.where(TenantRow.name == tenant)
    with db.session() as s:
        return [_limits(r) for r in s.scalars(query)]


def weight_of(db: Database, tenant_id: str | None) -> float:
    """The tenant's fair-share weight (1 for none: the command line)."""
    if tenant_id is None:
        return 1.0
    with db.session() as s:
        weight = s.scalar(select(TenantRow.weight).where(TenantRow.id == tenant_id))
    return 1.0 if weight is None else float(weight)


def _limits(row: TenantRow) -> TenantLimits:
    return TenantLimits(row.id, row.name, float(row.weight if row.weight is not None else 1.0), row.monthly_pages,
                        row.max_pages_in_flight)
