"""/v1/documents: upload a document (or an archive of them), its status (long poll), its outputs, its events."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Annotated, Any

from anyio import to_thread
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from paperlane.producer.api import uploads
from paperlane.producer.api.files import document_file
from paperlane.producer.api.options import checked
from paperlane.producer.api.service import CallerDep, Service, ServiceDep, check_room
from paperlane.schemas import OutputFormat
from paperlane.status import OutputsState, RollupState
from paperlane.storage import ingests, views
from paperlane.storage.db import as_utc, utcnow
from paperlane.storage.results import page_result
from paperlane.storage.tables import DocumentRow
from paperlane.storage.tenants import Caller

router = APIRouter(prefix="/v1/documents", tags=["documents"])

POLL = 0.25  # seconds between database reads while a client waits
_KEEPALIVE = 15.0
_UPLOAD_FORM = {"requestBody": {"content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file"], "properties": {
        "file": {"type": "string", "format": "binary"}, "lane": {"type": "string"}, "task": {"type": "string"},
        "fields": {"type": "array", "items": {"type": "string"}}, "to": {"type": "string"},
        "priority": {"type": "integer"}, "callback_url": {"type": "string"}, "name": {"type": "string"}}}}}}}


@router.post("", status_code=202, openapi_extra=_UPLOAD_FORM)
async def post_document(request: Request, svc: ServiceDep, who: CallerDep) -> JSONResponse:
    """Upload an image, PDF, TIFF or zip/tar archive; its pages are queued. Answers with its ids."""
    values, upload = await uploads.read_form(request, svc)
    try:
        opts, spec = await to_thread.run_sync(checked, values, who, svc.settings.api)  # resolves the callback host
        await to_thread.run_sync(check_room, svc, who)
        body = await to_thread.run_sync(uploads.register, svc, who, opts, spec, upload)
    finally:
        await upload.close()
    return JSONResponse(body, status_code=202)


@router.get("/{document_id}")
async def get_document(document_id: str, svc: ServiceDep, who: CallerDep,
                       wait: Annotated[float, Query(ge=0)] = 0) -> dict[str, Any]:
    """A document's status and progress; ``wait``: hold the answer until it changes (seconds, at most api.max_wait)."""

    def read() -> dict[str, Any]:
        return views.document_view(*ingests.document_progress(svc.db, document_id, tenant_id=who.tenant_id))
    return await wait_for_change(read, wait, svc.settings.api.max_wait)


@router.get("/{document_id}/result")
def get_result(document_id: str, svc: ServiceDep, who: CallerDep, format: OutputFormat = OutputFormat.JSON,
               page: Annotated[int | None, Query(ge=1, description="format=page: which page's PAGE XML")] = None
               ) -> Response:
    """The document in one format: JSON (its pages in order), markdown, searchable PDF, ALTO, hOCR, METS, or a page's
    PAGE XML, once its pages are final. What the workers wrote is read from the store; ALTO, PAGE XML, hOCR and METS
    they did not write are built now (documents of at most api.max_build_pages pages). 409 while its pages are being
    processed or (JSON, markdown, PDF) its outputs are being written (the document's ``outputs.state`` says which)."""
    row, progress, _ = ingests.document_progress(svc.db, document_id, tenant_id=who.tenant_id)
    return document_file(svc, row, done=progress.done, fmt=format, page=page)


@router.get("/{document_id}/events")
async def document_events(request: Request, document_id: str, svc: ServiceDep, who: CallerDep) -> StreamingResponse:
    """Server-Sent Events: ``page`` as each page finishes (with its result), then ``done``."""
    await to_thread.run_sync(partial(ingests.document_progress, svc.db, document_id,
                                     tenant_id=who.tenant_id))  # 404 before the stream starts
    return StreamingResponse(_events(request, svc, document_id, who), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def wait_for_change(read: Callable[[], dict[str, Any]], wait: float, max_wait: float) -> dict[str, Any]:
    """``read()`` now, or once it differs from now (long poll), or when ``wait`` seconds have passed."""
    view = await to_thread.run_sync(read)
    deadline = time.monotonic() + min(wait, max_wait)
    while time.monotonic() < deadline and not RollupState(view["status"]).final:
        await asyncio.sleep(POLL)
        newer = await to_thread.run_sync(read)
        if newer != view:
            return newer
    return view


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def _events(request: Request, svc: Service, document_id: str, who: Caller) -> AsyncIterator[bytes]:
    sent: set[str] = set()
    last = time.monotonic()
    while not await request.is_disconnected():
        pages = await to_thread.run_sync(ingests.document_pages, svc.db, document_id)
        document = await to_thread.run_sync(ingests.get_document, svc.db, document_id)
        for page, job in pages:
            if page.id not in sent and views.page_state(job).final:
                result = await to_thread.run_sync(partial(page_result, svc.store, job, source=document.source,
                                                          page_no=page.page_no))
                sent.add(page.id)
                last = time.monotonic()
                yield _sse("page", views.page_view(page.id, document_id, page.page_no, job, result=result))
        if pages and len(sent) == len(pages) and _outputs_settled(document):
            final = await to_thread.run_sync(partial(ingests.document_progress, svc.db, document_id,
                                                     tenant_id=who.tenant_id))
            yield _sse("done", views.document_view(*final))
            return
        if time.monotonic() - last > _KEEPALIVE:
            last = time.monotonic()
            yield b": keepalive\n\n"
        await asyncio.sleep(POLL)


def _outputs_settled(document: DocumentRow) -> bool:
    """Every page is final and the outputs are written or given up on, or still not written 10 s on (the stream
    ends without them; the document's status says they are pending)."""
    if document.outputs in (OutputsState.WRITTEN.value, OutputsState.FAILED.value):
        return True
    finished = as_utc(document.finished_at)
    return finished is not None and (utcnow() - finished).total_seconds() > 10
