"""/v1/ingests: register objects already in S3 as an ingest; an ingest's status.

A tenant reads only the prefixes it was granted (``paperlane keys grant``), never paperlane's own bucket, with
paperlane's S3 credentials. Registration goes on after the answer, on the ingests' own threads, one ingest per
tenant at a time: its documents' pages wait for room in the tenant's budget of pages in flight, what its archives
inflate is bounded like an upload's, and if it stops short (S3 unreadable, the API stopping) the ingest records why
and is closed with what it registered.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
import uuid
from typing import Annotated, Any

from anyio import to_thread
from fastapi import APIRouter, Query

from paperlane.errors import OverBudget, public_reason
from paperlane.producer import inputs
from paperlane.producer.api.documents import wait_for_change
from paperlane.producer.api.errors import ApiError, public
from paperlane.producer.api.options import Id, IngestRequest, checked
from paperlane.producer.api.service import CallerDep, Service, ServiceDep, check_budget, check_room
from paperlane.producer.submit import Submitter
from paperlane.status import RollupState
from paperlane.storage import ingests, tenants, views
from paperlane.storage.tenants import Caller, PageBudget

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/ingests", tags=["ingests"])

_ROOM_POLL = 2.0  # seconds between looks for room in the tenant's budget while an ingest waits for it


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
    submitter = Submitter(db=svc.db, store=svc.store, spec=spec, lane=opts.lane, priority=opts.priority,
                          publisher=svc.publisher, limits=svc.settings.ingest, resume=False,
                          owner=ingests.Owner(who.tenant_id, who.key_id, opts.callback_url),
                          pages=_Waiting(svc.pages(who), svc.stopping), weight=opts.weight)
    name = opts.name or ", ".join(sources)[:200]
    ingest_id = await to_thread.run_sync(lambda: submitter.open(name=name, sources=[*sources, str(uuid.uuid4())]))
    svc.registering_tenants.add(who.tenant_id)
    task = asyncio.get_running_loop().run_in_executor(svc.ingests, _register, svc, submitter, sources, name)
    svc.registering.add(task)
    task.add_done_callback(lambda done: _finished(svc, who, done))
    return {"ingest_id": ingest_id, "status": RollupState.REGISTERING.value}


@router.get("/{ingest_id}")
async def get_ingest(ingest_id: Id, svc: ServiceDep, who: CallerDep,
                     wait: Annotated[float, Query(ge=0)] = 0) -> dict[str, Any]:
    """An ingest's progress (``error``: why its registration stopped short), and its share of the engine now with the
    time it needs at that share; ``wait``: hold the answer until it changes (seconds, at most api.max_wait)."""

    def read() -> dict[str, Any]:
        row, progress, failures = ingests.ingest_progress(svc.db, ingest_id, tenant_id=who.tenant_id)
        share = (svc.fair.share_or_none(row.lane, row.tenant_id, row.id)
                 if svc.settings.fair_share.enabled and not progress.done else None)
        return views.ingest_view(row, progress, failures, share=share)
    return public(await wait_for_change(svc, who, read, wait))


@router.get("/{ingest_id}/review")
def get_review(ingest_id: Id, svc: ServiceDep, who: CallerDep,
               limit: Annotated[int, Query(ge=1, le=1000)] = 100,
               cursor: Annotated[str | None, Query(max_length=2000, pattern="^[A-Za-z0-9_=-]*$")] = None) -> dict[str, Any]:
    """The ingest's pages whose results need a person's eyes, with why (their quality flags) and their confidence,
    by document and page; ``cursor``: the ``next`` of the previous answer."""
    pages = ingests.review_pages(svc.db, ingest_id, tenant_id=who.tenant_id, limit=limit, after=_after(cursor))
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


class _Waiting:
    """A tenant's budget that an S3 ingest waits on: a document's pages are reserved once they fit."""

    def __init__(self, budget: PageBudget, stop: threading.Event) -> None:
        self.budget, self.stop = budget, stop

    def reserve(self, pages: int) -> None:
        while True:
            try:
                self.budget.reserve(pages)
                return
            except OverBudget as exc:
                if not exc.retryable or self.stop.wait(_ROOM_POLL):
                    raise

    def release(self, pages: int) -> None:
        self.budget.release(pages)


class _Stopped(Exception):
    """The API is stopping: registration ends here."""


def _register(svc: Service, submitter: Submitter, sources: list[str], name: str) -> None:
    """Register a whole S3 ingest (in a thread: a prefix may hold millions of objects); when it stops short, the
    ingest says why and is closed with what it holds."""
    from paperlane.storage.s3 import S3Store

    try:
        client = S3Store.from_settings(svc.settings.storage.model_copy(update={"create_bucket": False})).client
        items = inputs.expand(sources, svc.settings.ingest, s3=client)
        for _ in submitter.submit(items, name=name, sources=sources):
            if svc.stopping.is_set():
                raise _Stopped
    except Exception as exc:
        stopped = svc.stopping.is_set()
        why = "the API stopped while it was being registered" if stopped else public_reason(exc)
        log.error("ingest %s: registration stopped (%s)", submitter.summary.ingest_id, why, exc_info=exc)
        try:
            ingests.close_ingest(svc.db, submitter.summary.ingest_id, skipped=submitter.summary.skipped,
                                 error=f"registration stopped after {submitter.summary.documents:,} documents: {why}")
        except Exception:
            log.exception("ingest %s: could not be closed", submitter.summary.ingest_id)


def _finished(svc: Service, who: Caller, task: asyncio.Future[None]) -> None:
    svc.registering.discard(task)
    svc.registering_tenants.discard(who.tenant_id)
