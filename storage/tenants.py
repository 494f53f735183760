"""Tenants and their API keys.

A key is ``pl_`` and 43 random URL-safe characters (256 bits), shown once when it is made; the database
keeps its sha256 only (a key this random needs no slow hash: nothing can be guessed from the digest), and
its first characters to tell keys apart in lists. A tenant's webhook secret signs what it receives.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass

from sqlalchemy import select, update

from paperlane.errors import TenantNotFound, UsageError
from paperlane.storage.db import Database, utcnow
from paperlane.storage.tables import ApiKeyRow, TenantRow

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
                            created_at=utcnow())
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


def list_keys(db: Database, tenant: str | None = None) -> list[tuple[ApiKeyRow, str]]:
    """Keys (with their tenant's name), newest first."""
    with db.session() as s:
        query = (select(ApiKeyRow, TenantRow.name).join(TenantRow, TenantRow.id == ApiKeyRow.tenant_id)
                 .order_by(ApiKeyRow.created_at.desc()))
        if tenant is not None:
            query = query.where(TenantRow.name == tenant)
        return [(k, name) for k, name in s.execute(query)]


def revoke_key(db: Database, prefix: str) -> int:
    """Revoke the keys starting with ``prefix`` (at least 8 characters); how many were revoked."""
    if len(prefix) < 8:
        raise UsageError("give at least the first 8 characters of the key")
    with db.session() as s:
        done = s.execute(update(ApiKeyRow).where(ApiKeyRow.prefix.startswith(prefix[:10]),
                                                 ApiKeyRow.revoked_at.is_(None)).values(revoked_at=utcnow()))
        return int(done.rowcount or 0)


def webhook_secret(db: Database, tenant_id: str) -> str:
    with db.session() as s:
        secret = s.scalar(select(TenantRow.webhook_secret).where(TenantRow.id == tenant_id))
    if secret is None:
        raise TenantNotFound(tenant_id)
    return secret
