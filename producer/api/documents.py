"""/v1/documents: upload a document (or an archive of them), its status (long poll), its outputs, its events.

A stream of events ends with a ``revoked`` event, and a long poll answers 401, within the key cache's lifetime (5 s)
of its key's revocation. A stream of events and a long poll each count among the key's open streams (``api.max_streams_per_key``, over every
replica; 429 past it) while they last; a stream ends after ``api.stream_seconds`` (the client connects again and
gets the pages already final again). Both read the database every ``api.stream_poll`` seconds on the streams'
own threads, the document's counts first and its pages only when they changed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any

from anyio import CancelScope, to_thread
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from paperlane.producer.api import uploads
from paperlane.producer.api.errors import ApiError, public
from paperlane.producer.api.files import DOCUMENT_FILES, document_file
from paperlane.producer.api.limits import retry_after
from paperlane.producer.api.options import Id, checked, upload_form
from paperlane.producer.api.service import CallerDep, Service, ServiceDep, check_budget
from paperlane.producer.api.turns import Turn, TurnDep
from paperlane.schemas import OutputFormat
from paperlane.status import OutputsState, RollupState
from paperlane.storage import status_reads, views
from paperlane.storage.db import as_utc, utcnow
from paperlane.storage.results import page_result
from paperlane.storage.tables import DocumentRow
from paperlane.storage.tenants import Caller

router = APIRouter(prefix="/v1/documents", tags=["documents"])

_KEEPALIVE = 15.0


@router.post("", status_code=202, openapi_extra=upload_form())
async def post_document(request: Request, svc: ServiceDep, who: CallerDep) -> JSONResponse:
    """Upload an image, PDF, TIFF or zip/tar archive; its pages are queued. Answers with its ids."""
    values, upload = await uploads.read_form(request)
    try:
        opts, spec = await svc.resolving(checked, values, who, svc.settings.api)  # resolves the callback host
        await to_thread.run_sync(partial(svc.check_live, who, fresh=True))  # revoked while the body came: 401
        await to_thread.run_sync(check_budget, svc, who)
        body = await to_thread.run_sync(uploads.register, svc, who, opts, spec, upload, limiter=svc.registration)
    finally:
        await upload.close()
    return JSONResponse(body, status_code=202)


@router.get("/{document_id}")
async def get_document(document_id: Id, svc: ServiceDep, who: CallerDep, turn: TurnDep,
                       wait: Annotated[float, Query(ge=0)] = 0) -> dict[str, Any]:
    """A document's status and progress; ``wait``: hold the answer until it changes (seconds, at most api.max_wait)."""

    def read() -> dict[str, Any]:
        return views.document_view(*status_reads.document_progress(svc.db, document_id, tenant_id=who.tenant_id))
    return public(await wait_for_change(svc, who, read, wait, turn=turn))


@router.get("/{document_id}/result", response_class=Response, responses=DOCUMENT_FILES)
def get_result(document_id: Id, svc: ServiceDep, who: CallerDep, turn: TurnDep,
               format: OutputFormat = OutputFormat.JSON,
               page: Annotated[int | None, Query(ge=1, description="format=page: which page's PAGE XML")] = None
               ) -> Response:
    """The document in one format: JSON (its pages in order), markdown, searchable PDF, ALTO, hOCR, METS, or a page's
    PAGE XML, once its pages are final. What the workers wrote is read from the store; ALTO, PAGE XML, hOCR and METS
    they did not write are built now (documents of at most api.max_build_pages pages). 409 while its pages are being
    processed or (JSON, markdown, PDF) its outputs are being written (the document's ``outputs.state`` says which)."""
    row, progress, _ = status_reads.document_progress(svc.db, document_id, tenant_id=who.tenant_id)
    return document_file(svc, row, done=progress.done, fmt=format, page=page, tenant_id=who.tenant_id,
                         waiting=turn.give_back_from_thread)


@router.get("/{document_id}/events", response_class=StreamingResponse,
            responses={200: {"description": "the stream", "content": {"text/event-stream": {"schema": {"type": "string"}}}}})
async def document_events(request: Request, document_id: Id, svc: ServiceDep, who: CallerDep) -> StreamingResponse:
    """Server-Sent Events: ``page`` as each page finishes (with its result), then ``done``."""
    await svc.read(partial(status_reads.document_progress, svc.db, document_id,
                           tenant_id=who.tenant_id))  # 404 before the stream starts
    stream = await _Stream.open(svc, who)
    return StreamingResponse(_events(request, svc, document_id, who, stream), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def wait_for_change(svc: Service, who: Caller, read: Callable[[], dict[str, Any]],
                          wait: float, *, turn: Turn) -> dict[str, Any]:
    """``read()`` now, or once it differs from now (long poll, counted among the key's streams), or when ``wait``
    seconds (at most ``api.max_wait``) have passed. Each read holds the request's turn, each wait between them
    gives it back (``producer.api.turns``)."""
    api = svc.settings.api
    view = await svc.read(read)
    deadline = time.monotonic() + min(wait, api.max_wait)
    if time.monotonic() >= deadline or RollupState(view["status"]).final:
        return view
    stream = await _Stream.open(svc, who)
    try:
        while time.monotonic() < deadline:
            async with turn.aside():  # its reads take turns, its waits do not
                await asyncio.sleep(min(api.stream_poll, max(0.0, deadline - time.monotonic())))
            await to_thread.run_sync(svc.check_live, who)  # 401 once the key is revoked
            newer = await svc.read(read)
            if newer != view:
                return newer
            await stream.renew()
        return view
    finally:
        await stream.close()


@dataclass
class _Stream:
    """A stream (or long poll) counted among its key's open ones while it lasts: renewed every few seconds, so one
    whose replica died stops counting within ``_lapse``."""

    svc: Service
    who: Caller
    id: str
    renewed: float

    @classmethod
    async def open(cls, svc: Service, who: Caller) -> _Stream:
        """429 when the key holds ``api.max_streams_per_key`` already."""
        cap, stream = svc.settings.api.max_streams_per_key, uuid.uuid4().hex
        opened = await to_thread.run_sync(partial(svc.limits.open_stream, who.key_id, stream, cap=cap,
                                                  lapse=_lapse(svc)))
        if not opened:
            raise ApiError(429, "too_many_streams", f"this key has {cap} streams or long polls open "
                           "(api.max_streams_per_key)", {"Retry-After": retry_after(_lapse(svc))})
        return cls(svc, who, stream, time.monotonic())

    async def renew(self) -> None:
        if time.monotonic() - self.renewed >= _KEEPALIVE / 3:
            self.renewed = time.monotonic()
            await to_thread.run_sync(partial(self.svc.limits.renew_stream, self.who.key_id, self.id,
                                             lapse=_lapse(self.svc)))

    async def close(self) -> None:
        with CancelScope(shield=True), contextlib.suppress(Exception):  # also when the client went away
            await to_thread.run_sync(self.svc.limits.close_stream, self.who.key_id, self.id)


def _lapse(svc: Service) -> float:
    """How long an open stream stays counted without a renewal (renewals come every ``_KEEPALIVE / 3`` s)."""
    return 3 * svc.settings.api.stream_poll + _KEEPALIVE


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def _events(request: Request, svc: Service, document_id: str, who: Caller,
                  stream: _Stream) -> AsyncIterator[bytes]:
    try:
        async for frame in _frames(request, svc, document_id, who, stream):
            yield frame
    finally:
        await stream.close()


async def _frames(request: Request, svc: Service, document_id: str, who: Caller,
                  stream: _Stream) -> AsyncIterator[bytes]:
    api = svc.settings.api
    sent: set[str] = set()
    last = started = time.monotonic()
    seen: tuple[int, int] | None = None  # the document's final pages when its pages were last read
    while not await request.is_disconnected() and time.monotonic() - started < api.stream_seconds:
        if not await svc.read(svc.live, who):  # revoked: the stream ends within the key cache's lifetime
            yield _sse("revoked", {"error": {"code": "unauthorized", "message": "this API key was revoked"}})
            return
        document = await svc.read(status_reads.get_document, svc.db, document_id)
        if seen != (counts := (document.pages_succeeded, document.pages_failed)):
            pages = await svc.read(status_reads.document_pages, svc.db, document_id)
            seen = counts
            for page, job in pages:
                if page.id not in sent and views.page_state(job).final:
                    result = await svc.read(partial(page_result, svc.store, job, source=document.source,
                                                    page_no=page.page_no))
                    sent.add(page.id)
                    last = time.monotonic()
                    yield _sse("page", public(views.page_view(page.id, document_id, page.page_no, job,
                                                              result=result)))
        if document.pages_total and len(sent) >= document.pages_total and _outputs_settled(document):
            final = await svc.read(partial(status_reads.document_progress, svc.db, document_id,
                                           tenant_id=who.tenant_id))
            yield _sse("done", public(views.document_view(*final)))
            return
        if time.monotonic() - last > _KEEPALIVE:
            last = time.monotonic()
            yield b": keepalive\n\n"
        await stream.renew()
        await asyncio.sleep(api.stream_poll)


def _outputs_settled(document: DocumentRow) -> bool:
    """Every page is final and the outputs are written or given up on, or still not written 10 s on (the stream
    ends without them; the document's status says they are pending)."""
    if document.outputs in (OutputsState.WRITTEN.value, OutputsState.FAILED.value):
        return True
    finished = as_utc(document.finished_at)
    return finished is not None and (utcnow() - finished).total_seconds() > 10
