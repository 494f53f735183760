"""An upload: its multipart body read as it streams (the guard caps it at ``api.max_upload_bytes``), its type told
by its bytes, and its documents registered as an ingest of the caller's tenant.

An upload is registered whole or not at all: its pages are counted and reserved from the tenant's budget as its
documents are read (429 when they do not fit now), at most ``api.max_pages_per_upload`` of them (413), and what
its archives inflate is bounded by ``ingest.max_expansion`` of what was sent (413). Nothing is registered until
every document is read, so a refusal leaves no ingest behind; what was reserved is given back.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from fastapi import Request
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from paperlane import filetypes
from paperlane.errors import MonthlyBudgetUsed, OverBudget, PaperlaneError, public_reason
from paperlane.metrics import API_PAGES
from paperlane.producer import inputs
from paperlane.producer.api.errors import ApiError, public
from paperlane.producer.api.options import Options
from paperlane.producer.api.service import Service, monthly_refusal
from paperlane.producer.input_items import Document, Inflation, Skipped, safe_name
from paperlane.producer.submit import SubmittedPage, Submitter
from paperlane.schemas import TaskSpec
from paperlane.storage import ingests
from paperlane.storage.tenants import Caller

log = logging.getLogger(__name__)


async def read_form(request: Request) -> tuple[dict[str, Any], UploadFile]:
    """The upload's form fields (``fields`` split on commas) and its file, whose first bytes must say a format
    paperlane reads (415 otherwise)."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise ApiError(415, "unsupported_media_type", "send multipart/form-data with the document in 'file'")
    parser = MultiPartParser(request.headers, request.stream(), max_files=1, max_fields=20, max_part_size=4096)
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise ApiError(400, "invalid_request", f"bad multipart body: {exc.message}") from exc
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise ApiError(400, "invalid_request", "the document goes in the form field 'file'")
    if filetypes.sniff(await upload.read(filetypes.HEAD)) is None:
        await upload.close()
        raise ApiError(415, "unsupported_media_type", "not an image, PDF, TIFF or zip/tar archive (by its bytes)")
    values: dict[str, Any] = {k: v for k, v in form.items() if isinstance(v, str)}
    if "fields" in values:
        values["fields"] = [f for f in values["fields"].split(",") if f.strip()]
    return values, upload


class _Refused(Exception):
    """The upload is refused whole: the API's answer."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error


def register(svc: Service, who: Caller, opts: Options, spec: TaskSpec, upload: UploadFile) -> dict[str, Any]:
    """Register the upload's documents (in a thread: it reads and stores them); the ids of its ingest, documents
    and pages, and the archive members skipped. Raises ApiError: 413 (too many pages, archives that inflate too
    much), 429 (the tenant's pages in flight); nothing is registered then."""
    raw = (upload.filename or "upload").replace("\\", "/").rsplit("/", 1)[-1][:200]
    filename = re.sub(r"[\x00-\x1f\x7f]", "_", raw) or "upload"
    source = f"upload/{safe_name(filename)}{_ext(filename)}"
    upload.file.seek(0, 2)
    size = upload.file.tell()
    upload.file.seek(0)
    cap = svc.settings.api.max_pages_per_upload
    # chunk_pages=cap + 1: one chunk, registered once the whole upload has been read
    submitter = Submitter(db=svc.db, store=svc.store, spec=spec, lane=opts.lane, priority=opts.priority,
                          publisher=svc.publisher, limits=svc.settings.ingest, resume=False,
                          owner=ingests.Owner(who.tenant_id, who.key_id, opts.callback_url), uploads=svc.uploads,
                          chunk_pages=cap + 1, pages=svc.pages(who), weight=opts.weight)
    inflation = Inflation(svc.settings.ingest)
    items = _bounded(inputs.expand_upload(source, filename, upload.file, size, svc.settings.ingest,
                                          inflation=inflation), cap, inflation, live=lambda: svc.live(who, fresh=True))
    pages: list[SubmittedPage] = []
    skipped: list[dict[str, str]] = []
    try:
        for item in submitter.submit(items, name=opts.name or filename, sources=[f"upload:{uuid.uuid4()}"]):
            if isinstance(item, SubmittedPage):
                pages.append(item)
            else:
                skipped.append({"source": item.source, "reason": item.reason})
    except _Refused as exc:
        _abandon(svc, submitter, None)
        raise exc.error from None
    except OverBudget as exc:
        _abandon(svc, submitter, None)
        raise ApiError(429, "too_many_pages", str(exc), {"Retry-After": "10"}) from None
    except MonthlyBudgetUsed as exc:
        _abandon(svc, submitter, None)
        raise monthly_refusal(who, used=exc.used, limit=exc.limit) from None
    except BaseException as exc:
        _abandon(svc, submitter, public_reason(exc) if isinstance(exc, PaperlaneError) else "registration failed")
        raise
    API_PAGES.labels(opts.lane.value).inc(len(pages))
    return public(_answer(submitter.summary.ingest_id, pages, skipped))


def _bounded(items: Iterable[Document | Skipped], cap: int, inflation: Inflation, *,
             live: Callable[[], bool]) -> Iterator[Document | Skipped]:
    """``items``, stopped by a refusal of the whole upload: more than ``cap`` pages, archives that inflate past
    what the upload may cost, or a key revoked before its documents are registered (``live()`` false once they are
    all read: the upload is registered after its last document)."""
    pages = 0
    for item in items:
        if inflation.exceeded is not None:
            raise _Refused(ApiError(413, "too_large", f"the upload is refused: {inflation.exceeded}"))
        if isinstance(item, Document):
            pages += item.page_count
            if pages > cap:
                raise _Refused(ApiError(413, "too_many_pages", f"the upload has more than {cap:,} pages "
                                        "(api.max_pages_per_upload)"))
        yield item
    if not live():
        raise _Refused(ApiError(401, "unauthorized", "this API key was revoked", {"WWW-Authenticate": "Bearer"}))


def _abandon(svc: Service, submitter: Submitter, error: str | None) -> None:
    """An upload that stopped: its ingest deleted when nothing was registered into it, else closed with ``error``."""
    ingest_id = submitter.summary.ingest_id
    if not ingest_id:
        return
    try:
        if not ingests.discard_ingest(svc.db, ingest_id):
            ingests.close_ingest(svc.db, ingest_id, skipped=submitter.summary.skipped,
                                 error=error or "the upload was refused")
    except Exception:  # the database is down, say: the error that stopped the upload is the one to answer
        log.exception("upload ingest %s: could not be closed", ingest_id)


def _answer(ingest_id: str, pages: list[SubmittedPage], skipped: list[dict[str, str]]) -> dict[str, Any]:
    documents: dict[str, dict[str, Any]] = {}
    for p in pages:
        doc = documents.setdefault(p.document_id, {"document_id": p.document_id, "name": p.name, "source": p.source,
                                                   "error": p.error, "pages": []})
        doc["pages"].append({"page_id": p.page_id, "page_no": p.page_no, "job_id": p.job_id,
                             "status": p.status.value})
    return {"ingest_id": ingest_id,
            "document_id": next(iter(documents), None), "documents": list(documents.values()),
            "pages": [page for d in documents.values() for page in d["pages"]], "skipped": skipped}


def _ext(filename: str) -> str:
    stem, dot, ext = filename.rpartition(".")
    return f".{ext.lower()[:10]}" if dot and stem and ext.isalnum() else ""
