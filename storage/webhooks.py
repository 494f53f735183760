"""Webhook deliveries: an outbox in the database.

The change that finishes an ingest inserts its delivery in the same transaction (``enqueue``), so a
webhook is never lost nor sent for something that did not happen. Dispatchers (any API replica) claim
due deliveries (``claim_due``: on PostgreSQL ``FOR UPDATE SKIP LOCKED``, then pushed a lease ahead so
no other dispatcher takes them meanwhile), send them and ``record`` each try: delivered on a 2xx,
otherwise retried as the retry policy says (``paperlane.retry.RetryPolicy``: its doubling delays, given up once
its attempts are exhausted).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from paperlane.retry import RetryPolicy
from paperlane.status import PageState, rollup
from paperlane.storage.db import Database
from paperlane.storage.tables import DocumentRow, IngestRow, WebhookAttemptRow, WebhookDeliveryRow

_DELIVERIES = WebhookDeliveryRow.__table__
_MAX_DOCUMENTS = 1000  # documents listed in one payload; a bigger ingest's are read through the API


@dataclass(frozen=True)
class Delivery:
    id: str
    tenant_id: str
    ingest_id: str
    url: str
    event: str
    attempt: int  # this try's number, from 1


def enqueue(s: Session, *, ingest_id: str, tenant_id: str, url: str, event: str, now: datetime) -> None:
    s.execute(insert(_DELIVERIES).values(id=str(uuid.uuid4()), tenant_id=tenant_id, ingest_id=ingest_id, url=url,
                                         event=event, attempts=0, next_at=now, created_at=now))


def claim_due(db: Database, *, now: datetime, lease: float, limit: int = 20) -> list[Delivery]:
    """Deliveries due now, each held for ``lease`` seconds by this dispatcher."""
    w = WebhookDeliveryRow
    query = (select(w).where(w.delivered_at.is_(None), w.given_up_at.is_(None), w.next_at <= now)
             .order_by(w.next_at).limit(limit))
    if db.engine.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    with db.session() as s:
        rows = list(s.scalars(query))
        for row in rows:
            row.next_at = now + timedelta(seconds=lease)
        return [Delivery(r.id, r.tenant_id, r.ingest_id, r.url, r.event, r.attempts + 1) for r in rows]


def record(db: Database, delivery: Delivery, *, status: int | None, error: str | None, seconds: float,
           now: datetime, policy: RetryPolicy) -> str:
    """Record one try; returns "delivered", "retry" (due again after ``policy``'s delay for this try) or "given up"
    (``policy``'s attempts are exhausted)."""
    ok = status is not None and 200 <= status < 300
    with db.session() as s:
        s.add(WebhookAttemptRow(delivery_id=delivery.id, attempt=delivery.attempt, at=now, status=status,
                                error=error, seconds=seconds))
        row = s.get(WebhookDeliveryRow, delivery.id)
        assert row is not None
        row.attempts, row.last_status, row.last_error = delivery.attempt, status, error
        if ok:
            row.delivered_at = now
            return "delivered"
        if policy.exhausted(delivery.attempt):
            row.given_up_at = now
            return "given up"
        row.next_at = now + timedelta(seconds=policy.delay(delivery.attempt))
        return "retry"


def payload(db: Database, delivery: Delivery) -> dict[str, Any]:
    """What the receiver gets: the ingest's outcome and its documents'."""
    with db.session() as s:
        ingest = s.get(IngestRow, delivery.ingest_id)
        assert ingest is not None
        docs = list(s.scalars(select(DocumentRow).where(DocumentRow.ingest_id == ingest.id)
                              .order_by(DocumentRow.seq).limit(_MAX_DOCUMENTS)))
    return {
        "event": delivery.event, "delivery_id": delivery.id, "ingest_id": ingest.id, "name": ingest.name,
        "status": rollup(total=ingest.pages_total, succeeded=ingest.pages_succeeded, failed=ingest.pages_failed,
                         running=0).value,
        "pages": ingest.pages_total, **_counts(ingest.pages_succeeded, ingest.pages_failed),
        "finished_at": ingest.finished_at.isoformat() if ingest.finished_at else None,
        "documents": [{"document_id": d.id, "name": d.name, "pages": d.pages_total,
                       **_counts(d.pages_succeeded, d.pages_failed)} for d in docs],
    }


def _counts(succeeded: int, failed: int) -> dict[str, int]:
    return {PageState.SUCCEEDED.value: succeeded, PageState.FAILED.value: failed}


def deliveries(db: Database, ingest_id: str) -> list[tuple[WebhookDeliveryRow, list[WebhookAttemptRow]]]:
    """An ingest's webhook deliveries, each with its tries."""
    with db.session() as s:
        rows = list(s.scalars(select(WebhookDeliveryRow).where(WebhookDeliveryRow.ingest_id == ingest_id)
                              .order_by(WebhookDeliveryRow.created_at)))
        return [(r, list(s.scalars(select(WebhookAttemptRow).where(WebhookAttemptRow.delivery_id == r.id)
                                   .order_by(WebhookAttemptRow.attempt)))) for r in rows]
