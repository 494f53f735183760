"""An upload: its multipart body read within its limit (never buffered whole), its type told by its bytes, and
its documents registered as an ingest of the caller's tenant."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from typing import Any

from fastapi import Request
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from paperlane import filetypes
from paperlane.metrics import API_PAGES
from paperlane.producer import inputs
from paperlane.producer.api.errors import ApiError
from paperlane.producer.api.options import Options
from paperlane.producer.api.service import Service
from paperlane.producer.submit import SubmittedPage, Submitter
from paperlane.schemas import TaskSpec
from paperlane.storage import ingests
from paperlane.storage.tenants import Caller

_MULTIPART_SLACK = 64 * 1024  # the form's own bytes around the file


class _Limited:
    """The request body, cut off with a 413 once it passes the limit."""

    def __init__(self, request: Request, limit: int) -> None:
        self.request, self.limit, self.read = request, limit, 0

    async def stream(self) -> AsyncGenerator[bytes, None]:
        async for chunk in self.request.stream():
            self.read += len(chunk)
            if self.read > self.limit:
                raise ApiError(413, "too_large", f"the upload is over {self.limit - _MULTIPART_SLACK} bytes")
            yield chunk


async def read_form(request: Request, svc: Service) -> tuple[dict[str, Any], UploadFile]:
    """The upload's form fields (``fields`` split on commas) and its file, whose first bytes must say a format
    paperlane reads (415 otherwise)."""
    limit = svc.settings.api.max_upload_bytes + _MULTIPART_SLACK
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "too_large", f"the upload is over {svc.settings.api.max_upload_bytes} bytes")
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise ApiError(415, "unsupported_media_type", "send multipart/form-data with the document in 'file'")
    parser = MultiPartParser(request.headers, _Limited(request, limit).stream(), max_files=1, max_fields=20,
                             max_part_size=4096)
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


def register(svc: Service, who: Caller, opts: Options, spec: TaskSpec, upload: UploadFile) -> dict[str, Any]:
    """Register the upload's documents (in a thread: it reads and stores them); the ids of its ingest, documents
    and pages, and the archive members skipped."""
    filename = (upload.filename or "upload").replace("\\", "/").rsplit("/", 1)[-1][:200] or "upload"
    source = f"upload/{inputs.safe_name(filename)}{_ext(filename)}"
    upload.file.seek(0, 2)
    size = upload.file.tell()
    upload.file.seek(0)
    submitter = Submitter(db=svc.db, store=svc.store, spec=spec, lane=opts.lane, priority=opts.priority,
                          publisher=svc.publisher, limits=svc.settings.ingest, resume=False,
                          owner=ingests.Owner(who.tenant_id, who.key_id, opts.callback_url), uploads=svc.uploads)
    items = inputs.expand_upload(source, filename, upload.file, size, svc.settings.ingest)
    pages: list[SubmittedPage] = []
    skipped: list[dict[str, str]] = []
    for item in submitter.submit(items, name=opts.name or filename, sources=[f"upload:{uuid.uuid4()}"]):
        if isinstance(item, SubmittedPage):
            pages.append(item)
        else:
            skipped.append({"source": item.source, "reason": item.reason})
    API_PAGES.labels(opts.lane.value).inc(len(pages))
    documents: dict[str, dict[str, Any]] = {}
    for p in pages:
        doc = documents.setdefault(p.document_id, {"document_id": p.document_id, "name": p.name, "source": p.source,
                                                   "error": p.error, "pages": []})
        doc["pages"].append({"page_id": p.page_id, "page_no": p.page_no, "job_id": p.job_id,
                             "status": p.status.value})
    return {"ingest_id": submitter.summary.ingest_id,
            "document_id": next(iter(documents), None), "documents": list(documents.values()),
            "pages": [page for d in documents.values() for page in d["pages"]], "skipped": skipped}


def _ext(filename: str) -> str:
    stem, dot, ext = filename.rpartition(".")
    return f".{ext.lower()[:10]}" if dot and stem and ext.isalnum() else ""
