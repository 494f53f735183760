"""Time-first ids: the ids of ingests, documents, pages and jobs made since migration 0010, UUID-shaped and
ordered by the time they carry, so PostgreSQL's history tables (partitioned by id, ``storage.history``) find a
row's one partition from its id alone.

    ffff TTTTTTTTTTTT tttttttttttttttt      (32 hex digits, written 8-4-4-4-12)
    |    |            the tail: random, or a hash of what the id names (a derived id)
    |    milliseconds since 1970 (48 bits, good to the year 10889)
    the mark: above every hexadecimal id made before (uuid4/uuid5), but for one in 65,536 of them

A document's id carries its ingest's time and a page's its document's (``derived``): every page of an ingest
falls in the partition of the month the ingest was opened, and registering a page again derives the same id.
Ids made before the mark (uuid4/uuid5) sort below every time-first id: they live in the ``legacy`` partition.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime

MARK = "ffff"
_TAIL = 16  # hex digits after the mark and the time


def _shape(digits: str) -> str:
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:32]}"


def _millis(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def mint(at: datetime | None = None, *, name: str | None = None) -> str:
    """A new id carrying ``at`` (default: now); its tail is random, or a hash of ``name`` when given."""
    tail = hashlib.sha256(name.encode()).hexdigest()[:_TAIL] if name is not None else secrets.token_hex(_TAIL // 2)
    return _shape(f"{MARK}{_millis(at or datetime.now(UTC)):012x}{tail}")


def is_time_first(some_id: str) -> bool:
    return len(some_id) == 36 and some_id.startswith(MARK)


def derived(parent_id: str, name: str) -> str:
    """The id of ``name`` inside ``parent_id`` (a document of an ingest, a page of a document): the parent's
    time and a hash of both; the same arguments give the same id. ``parent_id`` must be time-first."""
    head = parent_id.replace("-", "")[:len(MARK) + 12]
    tail = hashlib.sha256(f"{parent_id}:{name}".encode()).hexdigest()[:_TAIL]
    return _shape(head + tail)


def span(parent_id: str) -> tuple[str, str] | None:
    """The lowest and highest id ``derived`` from ``parent_id`` can be (they share its time); None for an id made
    before time-first ids."""
    if not is_time_first(parent_id):
        return None
    head = parent_id.replace("-", "")[:len(MARK) + 12]
    return _shape(head + "0" * _TAIL), _shape(head + "f" * _TAIL)


def floor(at: datetime) -> str:
    """The lowest time-first id made at ``at`` or later: a partition's bound."""
    return _shape(f"{MARK}{_millis(at):012x}" + "0" * _TAIL)


def time_of(some_id: str) -> datetime | None:
    """When a time-first id was made; None for an id made before them."""
    if not is_time_first(some_id):
        return None
    digits = some_id.replace("-", "")
    return datetime.fromtimestamp(int(digits[len(MARK):len(MARK) + 12], 16) / 1000, UTC)
