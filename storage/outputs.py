"""A finished document's outputs as a recorded unit of work: due, claimed, then written, retried or failed.

The transaction that finishes a document (its last page final, or every page final at registration) makes its
outputs ``pending`` (``ingests.outputs_due``), so they are never lost with the worker that finished it. Whoever
writes them first claims them (``claim``, ``claim_due``: one UPDATE that only one claimant wins), holding them
until ``claimed_until``; the claim is what its outcome is checked against, so a claim that lapsed, or outputs made
due again meanwhile (a page redone), are not marked written by a stale writer. A failed try counts as an attempt
of the retry policy: due again after its backoff, or ``failed`` with the reason once the attempts are used up.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, Table, func, or_, select, update

from paperlane.retry import Action, RetryPolicy
from paperlane.schemas import OutputFormat
from paperlane.status import OutputsState
from paperlane.storage.db import Database
from paperlane.storage.objects import document_key
from paperlane.storage.tables import DocumentRow

_DOCUMENTS: Table = DocumentRow.__table__
_PENDING = OutputsState.PENDING.value


@dataclass(frozen=True)
class Claim:
    """This writer holds the outputs of ``document_id`` until ``until`` (also the claim's token)."""

    document_id: str
    until: datetime
    attempts: int  # failed tries before this one


def _claimable(now: datetime) -> ColumnElement[bool]:
    d = _DOCUMENTS.c
    return (d.outputs == _PENDING) & or_(d.outputs_claimed_until.is_(None), d.outputs_claimed_until < now)


def claim(db: Database, document_id: str, *, now: datetime, hold: float) -> Claim | None:
    """Claim the document's outputs if they are due and nobody holds them; None otherwise."""
    d = _DOCUMENTS.c
    until = now + timedelta(seconds=hold)
    with db.session() as s:
        attempts = s.scalar(update(_DOCUMENTS).where(d.id == document_id, _claimable(now))
                            .values(outputs_claimed_until=until).returning(d.outputs_attempts))
    return None if attempts is None else Claim(document_id, until, int(attempts))


def claim_due(db: Database, *, now: datetime, hold: float, limit: int = 10) -> list[Claim]:
    """Claim up to ``limit`` documents whose outputs are due and held by nobody (their finisher died, or a failed
    try's backoff is over). From a partial index: nothing to read when none are due."""
    d = _DOCUMENTS.c
    until = now + timedelta(seconds=hold)
    due = select(d.id).where(_claimable(now)).order_by(d.outputs_claimed_until).limit(limit)
    if db.engine.dialect.name == "postgresql":
        due = due.with_for_update(skip_locked=True)
    with db.session() as s:
        rows = s.execute(update(_DOCUMENTS).where(d.id.in_(due.scalar_subquery()), _claimable(now))
                         .values(outputs_claimed_until=until).returning(d.id, d.outputs_attempts)).all()
    return [Claim(doc_id, until, int(attempts)) for doc_id, attempts in rows]


def due_count(db: Database) -> int:
    """Documents whose outputs are due (``pending``: held by a writer or not): the backlog of ``paperlane outputs``.
    From the partial index the claims read."""
    with db.session() as s:
        return int(s.scalar(select(func.count()).select_from(_DOCUMENTS).where(_DOCUMENTS.c.outputs == _PENDING))
                   or 0)


def written(db: Database, held: Claim, *, formats: Collection[OutputFormat]) -> bool:
    """Record the outputs as written in ``formats`` (at ``objects.document_key``'s keys) where ``held`` says;
    False when the claim was lost meanwhile (its writes stand, and the outputs are written again by whoever holds
    them now)."""
    d = _DOCUMENTS.c
    key = {fmt: document_key(held.document_id, fmt) if fmt in formats else None
           for fmt in (OutputFormat.JSON, OutputFormat.MD, OutputFormat.PDF)}
    with db.session() as s:
        done = s.execute(update(_DOCUMENTS).where(d.id == held.document_id, d.outputs == _PENDING,
                                                  d.outputs_claimed_until == held.until)
                         .values(outputs=OutputsState.WRITTEN.value, outputs_claimed_until=None, outputs_error=None,
                                 output_formats=[fmt.value for fmt in OutputFormat if fmt in formats],
                                 json_key=key[OutputFormat.JSON], markdown_key=key[OutputFormat.MD],
                                 pdf_key=key[OutputFormat.PDF]))
    return bool(done.rowcount)


def written_formats(row: DocumentRow) -> list[OutputFormat]:
    """The formats the document's outputs were written in (none until they are), in ``OutputFormat``'s order."""
    if row.outputs != OutputsState.WRITTEN.value:
        return []
    if row.output_formats is not None:
        return [fmt for fmt in OutputFormat if fmt.value in row.output_formats]
    keys = {OutputFormat.JSON: row.json_key, OutputFormat.MD: row.markdown_key, OutputFormat.PDF: row.pdf_key}
    return [fmt for fmt, key in keys.items() if key]  # written before the formats were recorded


def failed_try(db: Database, held: Claim, error: BaseException, *, policy: RetryPolicy, now: datetime) -> OutputsState:
    """Record a try that failed with ``error``: due again after the policy's backoff, or failed for good."""
    attempts = held.attempts + 1
    decision = policy.decide(error, attempts=attempts)
    retry = decision.action is Action.RETRY
    d = _DOCUMENTS.c
    with db.session() as s:
        s.execute(update(_DOCUMENTS).where(d.id == held.document_id, d.outputs == _PENDING,
                                           d.outputs_claimed_until == held.until)
                  .values(outputs=_PENDING if retry else OutputsState.FAILED.value, outputs_attempts=attempts,
                          outputs_error=decision.reason,
                          outputs_claimed_until=now + timedelta(seconds=decision.delay) if retry else None))
    return OutputsState.PENDING if retry else OutputsState.FAILED
