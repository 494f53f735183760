"""/v1/ingests: register objects already in S3 as an ingest; an ingest's status.

A tenant reads only the prefixes it was granted (``paperlane keys grant``), never paperlane's own bucket, with
paperlane's S3 credentials. Registration goes on after the answer, on the ingests' own threads, one ingest per
tenant at a time. No thread waits on one tenant: when the tenant has no room in its budget of pages in flight for
the next document, what fitted is registered and the registration gives its thread back; it continues (skipping what
is registered) once there is room again. What its archives inflate is bounded like an upload's, and if
it stops short (S3 unreadable, its monthly budget used, the API stopping, also while it waits for room) the ingest
records why and is closed with what it registered; it is not resumed by another API process (start a new ingest of
the same prefix: what is registered is skipped). A continuation lists the prefix on from the last object whose
documents were all taken (kept in memory: ``inputs.expand``'s ``listed``), not from its start.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import uuid
from functools import partial
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from anyio import to_thread
from fastapi import APIRouter, Query

from paperlane.errors import OverBudget, PaperlaneError, public_reason
from paperlane.producer import inputs
from paperlane.producer.api.documents import wait_for_change
from paperlane.producer.api.errors import ApiError, public
from paperlane.producer.api.options import Id, IngestRequest, checked
from paperlane.producer.api.service import CallerDep, Service, ServiceDep, check_budget, check_room
from paperlane.producer.api.turns import TurnDep
from paperlane.producer.submit import Submitter
from paperlane.status import RollupState
from paperlane.storage import ingests, status_reads, tenants, views
from paperlane.storage.tenants import Caller, PageBudget

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/ingests", tags=["ingests"])

T = TypeVar("T")

_ROOM_POLL = 2.0  # seconds between looks for room in the tenant's budget while an ingest waits for it (no thread)
STOPPED = "the API stopped while it was being registered"  # an ingest's reason when the API stops under it


@router.post("", status_code=202)
async def post_ingest(req: IngestRequest, svc: ServiceDep, who: CallerDep) -> dict[str, Any]:
    """Register an s3:// prefix (or a list of keys) as an ingest; registration goes on after the answer."""
    opts, spec = await svc.resolving(checked, req, who, svc.settings.api)  # resolves the callback host
    sources = await to_thread.run_sync(_sources, req, svc, who)
    if who.tenant_id in svc.registering_tenants:
        raise ApiError(429, "ingest_registering", "an S3 ingest of this tenant is still being registered",
                       {"Retry-After": "10"})
    await to_thread.run_sync(check_room, svc, who)
    await to_thread.run_sync(check_budget, svc, who)
    sources_key = [*sources, str(uuid.uuid4())]  # this ingest's own key: a continuation reopens it (resume)

    def submitter() -> Submitter:
        return Submitter(db=svc.db, store=svc.store, spec=spec, lane=opts.lane, priority=opts.priority,
                         publisher=svc.publisher, limits=svc.settings.ingest, resume=True,
                         owner=ingests.Owner(who.tenant_id, who.key_id, opts.callback_url), pages=svc.pages(who),
                         weight=opts.weight, register_fitting=True)
    first = submitter()
    name = opts.name or ", ".join(sources)[:200]
    ingest_id = await to_thread.run_sync(lambda: first.open(name=name, sources=sources_key))
    svc.registering_tenants.add(who.tenant_id)
    task = asyncio.create_task(_drive(svc, who, first, submitter, _Job(sources, sources_key, name, who)))
    svc.registering.add(task)
    task.add_done_callback(lambda done: _finished(svc, who, done))
    return {"ingest_id": ingest_id, "status": RollupState.REGISTERING.value}


@router.get("/{ingest_id}")
async def get_ingest(ingest_id: Id, svc: ServiceDep, who: CallerDep, turn: TurnDep,
                     wait: Annotated[float, Query(ge=0)] = 0) -> dict[str, Any]:
    """An ingest's progress (``error``: why its registration stopped short), and its share of the engine now with the
    time it needs at that share; ``wait``: hold the answer until it changes (seconds, at most api.max_wait)."""

    def read() -> dict[str, Any]:
        row, progress, failures = status_reads.ingest_progress(svc.db, ingest_id, tenant_id=who.tenant_id)
        share = (svc.fair.share_or_none(row.lane, row.tenant_id, row.id)
                 if svc.settings.fair_share.enabled and not progress.done else None)
        return views.ingest_view(row, progress, failures, share=share)
    return public(await wait_for_change(svc, who, read, wait, turn=turn))


@router.get("/{ingest_id}/review")
def get_review(ingest_id: Id, svc: ServiceDep, who: CallerDep,
               limit: Annotated[int, Query(ge=1, le=1000)] = 100,
               cursor: Annotated[str | None, Query(max_length=2000, pattern="^[A-Za-z0-9_=-]*$")] = None) -> dict[str, Any]:
    """The ingest's pages whose results need a person's eyes, with why (their quality flags) and their confidence,
    by document and page; ``cursor``: the ``next`` of the previous answer."""
    pages = status_reads.review_pages(svc.db, ingest_id, tenant_id=who.tenant_id, limit=limit, after=_after(cursor))
    last = pages[-1] if len(pages) == limit else None
    return {"ingest_id": ingest_id, "pages": [views.review_view(p) for p in pages],
            "next": _cursor(last.source, last.page_no) if last else None}


def _cursor(source: str, page_no: int) -> str:
    return base64.urlsafe_b64encode(json.dumps([source, page_no]).encode()).decode()


def _after(cursor: str | None) -> tuple[str, int] | None:
    if cursor is None:
        return None
    try:
        source, page_no = json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except (ValueError, TypeError) as exc:
        raise ApiError(422, "invalid_request", "cursor: not one this API gave") from exc
    # Only what _cursor writes: a printable source and a whole page number (no NaN, no 1e400, no NUL).
    if not (isinstance(source, str) and source.isprintable() and type(page_no) is int and 0 <= page_no < 2**31):
        raise ApiError(422, "invalid_request", "cursor: not one this API gave")
    return source, page_no


def _sources(req: IngestRequest, svc: Service, who: Caller) -> list[str]:
    """The s3:// URLs to register: each within a grant of the caller's tenant (403 otherwise)."""
    sources = [req.source] if req.source else []  # the model has one of the two at least
    if req.bucket and req.keys:
        sources += [f"s3://{req.bucket}/{k.lstrip('/')}" for k in req.keys]
    grants = tenants.granted(svc.db, who.tenant_id)
    for s in sources:
        inputs.check_paths([s])
        bucket, _, prefix = s[5:].partition("/")
        if any(not c.isprintable() for c in s) or any(part in (".", "..") for part in prefix.split("/")):
            raise ApiError(400, "invalid_request", "an S3 key or prefix may not hold control characters or . or .. "
                           "as a path segment")
        if bucket == svc.settings.storage.bucket or not tenants.covers(grants, bucket, prefix):
            raise ApiError(403, "bucket_forbidden", f"this tenant may not ingest s3://{bucket}/{prefix}")
    return sources


@dataclass(frozen=True)
class _Job:
    sources: list[str]  # the s3:// URLs to register
    key: list[str]  # what the ingest was opened with (its key): a continuation reopens it
    name: str
    who: Caller  # whose key started it: registration stops once it is revoked
    listed: dict[str, str] = field(default_factory=dict)  # s3:// URL -> its last object done: a continuation
    # lists on from there (``inputs.expand``), not from the start of the prefix


async def _drive(svc: Service, who: Caller, first: Submitter, again: Callable[[], Submitter], job: _Job) -> None:
    """Register an S3 ingest on the ingests' threads; while its tenant has no room for its next document, it holds
    no thread: what fitted is registered, and registration continues (skipping what is registered) once the tenant
    has room again, or ends when the API stops."""
    loop, submitter = asyncio.get_running_loop(), first
    while True:
        # Cancelled here (the API stopping), the thread goes on to see svc.stopping and closes the ingest itself.
        waiting = await loop.run_in_executor(svc.ingests, _register, svc, submitter, job)
        if not waiting:
            return
        try:
            why = await _room(svc, who)
            if not why:
                submitter = again()
                await to_thread.run_sync(partial(submitter.open, name=job.name, sources=job.key))
        except asyncio.CancelledError:  # the API stopped while it waited for room: the ingest says so
            _close(svc, submitter, STOPPED)
            raise
        if why:
            _close(svc, submitter, why)
            return


async def _room(svc: Service, who: Caller) -> str | None:
    """Wait, holding no thread, until the tenant has room for a page (None), or say why registration ends: the API
    stops, or the key that started it was revoked (looked up afresh before it goes on)."""
    budget = svc.pages(who)
    while not svc.stopping.is_set():
        in_flight, cap = await to_thread.run_sync(budget.room)
        if not await to_thread.run_sync(partial(svc.live, who, fresh=in_flight < cap)):
            return _Revoked().message
        if in_flight < cap:
            return None
        await asyncio.sleep(_ROOM_POLL)
    return STOPPED


class _Stopped(Exception):
    """The API is stopping: registration ends here."""


class _Revoked(PaperlaneError):
    def __init__(self) -> None:
        super().__init__("the API key that started it was revoked")


def _while_live(svc: Service, who: Caller, items: Iterable[T]) -> Iterator[T]:
    """``items`` while the key is not revoked (looked up every few seconds: ``Service.live``)."""
    for item in items:
        if not svc.live(who):
            raise _Revoked
        yield item


def _register(svc: Service, submitter: Submitter, job: _Job) -> bool:
    """Register an S3 ingest (in a thread: a prefix may hold millions of objects); True when it stopped for room in
    its tenant's budget (what fitted is registered). When it stops short otherwise, the ingest says why and is
    closed with what it holds."""
    from paperlane.storage.s3 import S3Store

    try:
        client = S3Store.from_settings(svc.settings.storage.model_copy(update={"create_bucket": False})).client
        items = _while_live(svc, job.who, inputs.expand(job.sources, svc.settings.ingest, s3=client,
                                                          listed=job.listed))
        for _ in submitter.submit(items, name=job.name, sources=job.key):
            if svc.stopping.is_set():
                raise _Stopped
    except OverBudget as exc:
        if exc.retryable and not svc.stopping.is_set():
            return True
        _close(svc, submitter, public_reason(exc), exc)
    except Exception as exc:
        stopped = svc.stopping.is_set()
        _close(svc, submitter, STOPPED if stopped else public_reason(exc), exc)
    return False


def _close(svc: Service, submitter: Submitter, why: str, exc: BaseException | None = None) -> None:
    log.error("ingest %s: registration stopped (%s)", submitter.summary.ingest_id, why, exc_info=exc)
    try:
        ingests.close_ingest(svc.db, submitter.summary.ingest_id, skipped=submitter.summary.skipped,
                             error=f"registration stopped after {submitter.summary.documents:,} documents: {why}")
    except Exception:
        log.exception("ingest %s: could not be closed", submitter.summary.ingest_id)


def _finished(svc: Service, who: Caller, task: asyncio.Future[None]) -> None:
    svc.registering.discard(task)
    svc.registering_tenants.discard(who.tenant_id)
