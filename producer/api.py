"""paperlane's HTTP API (FastAPI): another producer and reader over the same ingests, documents and pages.

Every answer about state is read from the database, so any replica answers for any worker; uploads are
registered exactly as ``paperlane submit`` registers files (``Submitter``), as an ingest of the caller's
tenant. ``/docs`` serves the OpenAPI description, ``/`` a web page to try it.

Errors have one shape, ``{"error": {"code": ..., "message": ...}}``, with a public message only: nothing
internal (a traceback, a SQL statement, a host name) reaches a client. Another tenant's ids answer 404,
as unknown ids do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from importlib import resources
from typing import Annotated, Any

import redis
from anyio import to_thread
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import func, select, text
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException, MultiPartParser

from paperlane.errors import JobNotFound, StorageUnavailable, UsageError, public_reason
from paperlane.metrics import API_PAGES, API_REQUESTS, API_SECONDS
from paperlane.priority.broker import make_celery
from paperlane.priority.lanes import Lane
from paperlane.producer import inputs
from paperlane.producer.submit import CeleryPublisher, SubmittedPage, Submitter
from paperlane.producer.webhooks import Dispatcher, check_callback
from paperlane.schemas import JobStatus, Task, TaskSpec
from paperlane.settings import Settings
from paperlane.storage import ingests
from paperlane.storage.db import Database, as_utc, utcnow
from paperlane.storage.objects import ObjectStore, open_store
from paperlane.storage.results import page_result
from paperlane.storage.tables import DocumentRow, IngestRow
from paperlane.storage.tenants import Caller, authenticate

log = logging.getLogger(__name__)

_MULTIPART_SLACK = 64 * 1024  # the form's own bytes around the file
_POLL = 0.25  # seconds between database reads while a client waits
_KEEPALIVE = 15.0
_AUTH_TTL = 5.0  # seconds a key's lookup is reused (a revoked key stops within this)


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


@dataclass
class Service:
    """What the routes share: settings, database, object store, broker, Redis (rate limits)."""

    settings: Settings
    db: Database
    store: ObjectStore
    publisher: CeleryPublisher
    redis: redis.Redis
    auth_cache: dict[str, tuple[float, Caller | None]] = field(default_factory=dict)
    registering: set[asyncio.Future[None]] = field(default_factory=set)  # S3 ingests being registered
    uploads: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(16, thread_name_prefix="upload"))

    @classmethod
    def open(cls, settings: Settings) -> Service:
        db = Database(settings.database_url, pool_size=settings.database.pool_size)
        return cls(settings, db, open_store(settings), CeleryPublisher(make_celery(settings)),
                   redis.Redis.from_url(settings.redis.url, socket_timeout=2, socket_connect_timeout=2))

    def close(self) -> None:
        self.uploads.shutdown(wait=True)
        self.db.dispose()
        self.redis.close()


def create_app(settings: Settings, *, webhooks: bool = True) -> FastAPI:
    """The API app. ``webhooks``: run this process's webhook dispatcher."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = Service.open(settings)
        await to_thread.run_sync(service.db.upgrade)
        app.state.service = service
        dispatcher = Dispatcher(service.db, settings.api) if webhooks else None
        task = asyncio.create_task(dispatcher.run()) if dispatcher else None
        try:
            yield
        finally:
            if dispatcher and task:
                dispatcher.stop()
                await task
            service.close()

    app = FastAPI(title="paperlane", version="1", lifespan=lifespan,
                  description="Scanned documents to structured text: upload, wait, stream page results.")
    _install_errors(app)
    _install_metrics(app)
    _routes(app)
    return app


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.code, exc.message, exc.headers)

    @app.exception_handler(JobNotFound)
    async def not_found(request: Request, exc: JobNotFound) -> JSONResponse:
        return _error(404, "not_found", "no such resource")

    @app.exception_handler(UsageError)
    async def usage(request: Request, exc: UsageError) -> JSONResponse:
        return _error(400, "invalid_request", public_reason(exc))

    @app.exception_handler(StorageUnavailable)
    async def unavailable(request: Request, exc: StorageUnavailable) -> JSONResponse:
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        return _error(503, "unavailable", "a service paperlane needs is unreachable; try again",
                      {"Retry-After": "5"})

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return _error(422, "invalid_request", f"{where}: {first.get('msg', 'invalid')}" if where else "invalid")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error(exc.status_code, code, "no such resource" if exc.status_code == 404 else code.replace("_", " "))

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return _error(500, "internal", "internal error")


def _install_metrics(app: FastAPI) -> None:
    @app.middleware("http")
    async def measure(request: Request, call_next: Callable[[Request], Any]) -> Response:
        started = time.perf_counter()
        response: Response = await call_next(request)
        route = getattr(request.scope.get("route"), "path", "unmatched")
        API_SECONDS.labels(request.method, route).observe(time.perf_counter() - started)
        API_REQUESTS.labels(request.method, route, str(response.status_code)).inc()
        return response


# --- callers ---------------------------------------------------------------------------------------


def _service(request: Request) -> Service:
    return request.app.state.service  # type: ignore[no-any-return]


def _caller(request: Request) -> Caller:
    """The key's caller, rate limited; 401 without a valid key, 429 past the key's rate."""
    service = _service(request)
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError(401, "unauthorized", "an API key is needed: Authorization: Bearer KEY",
                       {"WWW-Authenticate": "Bearer"})
    key = key.strip()
    now = time.monotonic()
    cached = service.auth_cache.get(key)
    if cached is None or cached[0] < now:
        if len(service.auth_cache) > 10_000:
            service.auth_cache.clear()
        cached = (now + _AUTH_TTL, authenticate(service.db, key))
        service.auth_cache[key] = cached
    caller = cached[1]
    if caller is None:
        raise ApiError(401, "unauthorized", "unknown or revoked API key", {"WWW-Authenticate": "Bearer"})
    _rate_limit(service, caller)
    return caller


def _rate_limit(service: Service, caller: Caller) -> None:
    """A fixed one-minute window per key, counted in Redis (shared by every replica)."""
    window = int(time.time() // 60)
    name = f"paperlane:rate:{caller.key_id}:{window}"
    try:
        with service.redis.pipeline(transaction=False) as pipe:
            pipe.incr(name)
            pipe.expire(name, 120)
            count, _ = pipe.execute()
    except redis.RedisError as exc:
        raise StorageUnavailable(f"redis: {exc}") from exc
    if int(count) > service.settings.api.rate_per_minute:
        retry = 60 - int(time.time()) % 60
        raise ApiError(429, "rate_limited", f"more than {service.settings.api.rate_per_minute} requests a minute "
                       "with this key", {"Retry-After": str(retry)})


CallerDep = Annotated[Caller, Depends(_caller)]


def _pages_in_flight(db: Database, key_id: str) -> int:
    """Pages of this key's unfinished ingests that are not final yet (from the ingests' rolled-up counts)."""
    i = IngestRow
    with db.session() as s:
        n = s.scalar(select(func.coalesce(func.sum(i.pages_total - i.pages_succeeded - i.pages_failed), 0))
                     .where(i.api_key_id == key_id, i.finished_at.is_(None)))
    return int(n or 0)


# --- views -----------------------------------------------------------------------------------------


def _state(p: ingests.Progress) -> str:
    if not p.done:
        return "running" if p.running or p.succeeded or p.failed else "queued"
    return "succeeded" if p.failed == 0 else "failed" if p.succeeded == 0 else "partial"


def _document_view(row: DocumentRow, p: ingests.Progress, failures: list[tuple[str, int]]) -> dict[str, Any]:
    return {
        "document_id": row.id, "ingest_id": row.ingest_id, "name": row.name, "source": row.source,
        "status": _state(p), "error": row.error, "pages": p.total, "queued": p.queued, "running": p.running,
        "succeeded": p.succeeded, "failed": p.failed, "unpublished": p.unpublished,
        "failures": [{"reason": r, "pages": n} for r, n in failures],
        "outputs": {"json": bool(row.json_key), "markdown": bool(row.markdown_key), "pdf": bool(row.pdf_key)},
        "created_at": row.created_at.isoformat() if row.created_at else None,
        "finished_at": row.finished_at.isoformat() if row.finished_at else None,
    }


def _ingest_view(row: IngestRow, p: ingests.Progress, failures: list[tuple[str, int]]) -> dict[str, Any]:
    return {
        "ingest_id": row.id, "name": row.name, "lane": row.lane, "task": row.task,
        "status": "registering" if row.registered_at is None else _state(p),
        "documents": row.documents_total, "skipped": row.skipped, "pages": p.total, "queued": p.queued,
        "running": p.running, "succeeded": p.succeeded, "failed": p.failed, "unpublished": p.unpublished,
        "pages_per_s": round(p.pages_per_s, 2) if p.pages_per_s else None,
        "eta_s": round(p.eta_s, 1) if p.eta_s is not None else None,
        "failures": [{"reason": r, "pages": n} for r, n in failures],
        "finished_at": row.finished_at.isoformat() if row.finished_at else None,
    }


def _page_view(service: Service, page_id: str, document_id: str, page_no: int, job: Any,
               source: str, *, with_result: bool) -> dict[str, Any]:
    status = JobStatus(job.status)
    view: dict[str, Any] = {
        "page_id": page_id, "document_id": document_id, "page_no": page_no, "job_id": job.id,
        "status": "unpublished" if status is JobStatus.QUEUED and job.enqueued_at is None else status.value,
        "error": job.error, "annotated_url": f"/v1/pages/{page_id}/annotated" if job.annotated_key else None,
    }
    if with_result and status.terminal:
        result = page_result(service.store, job, source=source, page_no=page_no)
        view["result"] = result.model_dump(mode="json", exclude={"job_id"})
    return view


async def _wait_for_change(read: Callable[[], dict[str, Any]], wait: float, max_wait: float) -> dict[str, Any]:
    """``read()`` now, or once it differs from now (long poll), or when ``wait`` seconds have passed."""
    view = await to_thread.run_sync(read)
    deadline = time.monotonic() + min(wait, max_wait)
    while time.monotonic() < deadline and view.get("status") not in ("succeeded", "failed", "partial"):
        await asyncio.sleep(_POLL)
        newer = await to_thread.run_sync(read)
        if newer != view:
            return newer
    return view


# --- uploads ---------------------------------------------------------------------------------------


class _Limited:
    """The request body, cut off with a 413 once it passes the limit (never buffered whole)."""

    def __init__(self, request: Request, limit: int) -> None:
        self.request, self.limit, self.read = request, limit, 0

    async def stream(self) -> AsyncGenerator[bytes, None]:
        async for chunk in self.request.stream():
            self.read += len(chunk)
            if self.read > self.limit:
                raise ApiError(413, "too_large", f"the upload is over {self.limit - _MULTIPART_SLACK} bytes")
            yield chunk


async def _form(request: Request, service: Service) -> tuple[dict[str, str], UploadFile]:
    limit = service.settings.api.max_upload_bytes + _MULTIPART_SLACK
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "too_large", f"the upload is over {service.settings.api.max_upload_bytes} bytes")
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
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    return fields, upload


class _Options(BaseModel):
    lane: Lane = Lane.BATCH
    task: Task = Task.SPOTTING
    fields: list[str] = Field(default_factory=list)
    to: str = "English"
    priority: int = Field(0, ge=0, le=4)
    callback_url: str | None = None
    name: str | None = Field(None, max_length=200)


def _options(values: dict[str, Any], caller: Caller, service: Service) -> tuple[_Options, TaskSpec]:
    try:
        opts = _Options.model_validate(values)
        spec = TaskSpec(task=opts.task, fields=tuple(opts.fields), target_language=opts.to)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ApiError(422, "invalid_request", f"{where}: {first['msg']}" if where else first["msg"]) from None
    if opts.lane is Lane.INTERACTIVE and not caller.interactive:
        raise ApiError(403, "lane_forbidden", "this key may not use the interactive lane")
    if opts.callback_url:
        check_callback(opts.callback_url, allow_private=service.settings.api.webhook_private)
    return opts, spec


def _check_room(service: Service, caller: Caller) -> None:
    in_flight = _pages_in_flight(service.db, caller.key_id)
    cap = service.settings.api.max_pages_in_flight
    if in_flight >= cap:
        raise ApiError(429, "too_many_pages", f"{in_flight} pages of this key are not finished (at most {cap})",
                       {"Retry-After": "10"})


def _register_upload(service: Service, caller: Caller, opts: _Options, spec: TaskSpec,
                     upload: UploadFile) -> dict[str, Any]:
    filename = (upload.filename or "upload").replace("\\", "/").rsplit("/", 1)[-1][:200] or "upload"
    source = f"upload/{inputs.safe_name(filename)}{_ext(filename)}"
    upload.file.seek(0, 2)
    size = upload.file.tell()
    upload.file.seek(0)
    submitter = Submitter(db=service.db, store=service.store, spec=spec, lane=opts.lane, level=opts.priority,
                          publisher=service.publisher, limits=service.settings.ingest, resume=False,
                          owner=ingests.Owner(caller.tenant_id, caller.key_id, opts.callback_url),
                          uploads=service.uploads)
    items = inputs.expand_upload(source, filename, upload.file, size, service.settings.ingest)
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


class IngestRequest(BaseModel):
    """Register objects already in S3 as a batch ingest."""

    source: str | None = Field(None, description="s3://bucket/prefix: every object under it")
    bucket: str | None = Field(None, description="with keys: the bucket of the listed objects")
    keys: list[str] = Field(default_factory=list, max_length=10_000, description="object keys, each a document")
    lane: Lane = Lane.BATCH
    task: Task = Task.SPOTTING
    fields: list[str] = Field(default_factory=list)
    to: str = "English"
    priority: int = Field(0, ge=0, le=4)
    callback_url: str | None = None
    name: str | None = Field(None, max_length=200)


def _ingest_sources(req: IngestRequest, service: Service) -> list[str]:
    if req.source:
        if not req.source.startswith("s3://") or req.keys:
            raise ApiError(422, "invalid_request", "give source as s3://bucket/prefix, or bucket and keys")
        sources = [req.source]
    elif req.bucket and req.keys:
        sources = [f"s3://{req.bucket}/{k.lstrip('/')}" for k in req.keys]
    else:
        raise ApiError(422, "invalid_request", "give source (s3://bucket/prefix) or bucket and keys")
    for s in sources:
        inputs.check_paths([s])
        if s[5:].partition("/")[0] not in service.settings.api.ingest_buckets:
            raise ApiError(403, "bucket_forbidden", f"ingests may not read the bucket {s[5:].partition('/')[0]}")
    return sources


def _run_ingest(service: Service, submitter: Submitter, sources: list[str], name: str) -> None:
    """Register a whole S3 ingest (in a thread: a prefix may hold millions of objects)."""
    from paperlane.storage.s3 import S3Store

    try:
        client = S3Store.from_settings(service.settings.storage.model_copy(update={"create_bucket": False})).client
        items = inputs.expand(sources, service.settings.ingest, s3=client)
        for _ in submitter.submit(items, name=name, sources=sources):
            pass
    except Exception as exc:
        log.error("ingest %s: registration stopped (%s)", submitter.summary.ingest_id, public_reason(exc),
                  exc_info=exc)


# --- routes ----------------------------------------------------------------------------------------


def _routes(app: FastAPI) -> None:  # noqa: C901 - one function holds the route table
    @app.get("/", include_in_schema=False)
    def index() -> HTMLResponse:
        return HTMLResponse(resources.files("paperlane.producer").joinpath("web/index.html").read_text("utf-8"))

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    def readyz(request: Request) -> JSONResponse:
        """The database, Redis and the object store answer."""
        service = _service(request)
        checks: dict[str, str] = {}
        for name, check in (("database", partial(_db_ready, service.db)), ("redis", service.redis.ping),
                            ("objects", partial(service.store.exists, "readyz"))):
            try:
                check()
                checks[name] = "ok"
            except Exception as exc:
                log.warning("readyz: %s: %s", name, exc)
                checks[name] = "unreachable"
        ok = all(v == "ok" for v in checks.values())
        return JSONResponse({"status": "ok" if ok else "unavailable", "checks": checks}, status_code=200 if ok else 503)

    @app.post("/v1/documents", status_code=202, tags=["documents"],
              openapi_extra={"requestBody": {"content": {"multipart/form-data": {"schema": {
                  "type": "object", "required": ["file"], "properties": {
                      "file": {"type": "string", "format": "binary"}, "lane": {"type": "string"},
                      "task": {"type": "string"}, "fields": {"type": "array", "items": {"type": "string"}},
                      "to": {"type": "string"}, "priority": {"type": "integer"},
                      "callback_url": {"type": "string"}, "name": {"type": "string"}}}}}}})
    async def post_document(request: Request, caller: CallerDep) -> JSONResponse:
        """Upload an image, PDF, TIFF or zip/tar archive; its pages are queued. Answers with its ids."""
        service = _service(request)
        fields, upload = await _form(request, service)
        try:
            head = await upload.read(1024)
            if inputs.sniff(head) is None:
                raise ApiError(415, "unsupported_media_type",
                               "not an image, PDF, TIFF or zip/tar archive (by its bytes)")
            values: dict[str, Any] = dict(fields)
            if "fields" in values:
                values["fields"] = [f for f in values["fields"].split(",") if f.strip()]
            opts, spec = await to_thread.run_sync(_options, values, caller, service)  # resolves the callback host
            await to_thread.run_sync(_check_room, service, caller)
            body = await to_thread.run_sync(_register_upload, service, caller, opts, spec, upload)
        finally:
            await upload.close()
        return JSONResponse(body, status_code=202)

    @app.post("/v1/ingests", status_code=202, tags=["ingests"])
    async def post_ingest(request: Request, req: IngestRequest, caller: CallerDep) -> dict[str, Any]:
        """Register an s3:// prefix (or a list of keys) as an ingest; registration goes on after the answer."""
        service = _service(request)
        opts, spec = await to_thread.run_sync(_options, req.model_dump(include=set(_Options.model_fields)), caller,
                                              service)  # off the event loop: it resolves the callback host
        sources = _ingest_sources(req, service)
        await to_thread.run_sync(_check_room, service, caller)
        submitter = Submitter(db=service.db, store=service.store, spec=spec, lane=opts.lane, level=opts.priority,
                              publisher=service.publisher, limits=service.settings.ingest, resume=False,
                              owner=ingests.Owner(caller.tenant_id, caller.key_id, opts.callback_url))
        name = opts.name or ", ".join(sources)[:200]
        ingest_id = await to_thread.run_sync(lambda: submitter.open(name=name, sources=[*sources, str(uuid.uuid4())]))
        task = asyncio.get_running_loop().run_in_executor(None, _run_ingest, service, submitter, sources, name)
        service.registering.add(task)
        task.add_done_callback(service.registering.discard)
        return {"ingest_id": ingest_id, "status": "registering"}

    @app.get("/v1/ingests/{ingest_id}", tags=["ingests"])
    async def get_ingest(request: Request, ingest_id: str, caller: CallerDep,
                         wait: Annotated[float, Query(ge=0)] = 0) -> dict[str, Any]:
        """An ingest's progress; ``wait``: hold the answer until it changes (seconds, at most api.max_wait)."""
        service = _service(request)

        def read() -> dict[str, Any]:
            return _ingest_view(*ingests.ingest_progress(service.db, ingest_id, tenant_id=caller.tenant_id))
        return await _wait_for_change(read, wait, service.settings.api.max_wait)

    @app.get("/v1/documents/{document_id}", tags=["documents"])
    async def get_document(request: Request, document_id: str, caller: CallerDep,
                           wait: Annotated[float, Query(ge=0)] = 0) -> dict[str, Any]:
        """A document's status and progress; ``wait``: hold the answer until it changes."""
        service = _service(request)

        def read() -> dict[str, Any]:
            return _document_view(*ingests.document_progress(service.db, document_id, tenant_id=caller.tenant_id))
        return await _wait_for_change(read, wait, service.settings.api.max_wait)

    @app.get("/v1/documents/{document_id}/result", tags=["documents"])
    def get_result(request: Request, document_id: str, caller: CallerDep,
                   format: Annotated[str, Query(pattern="^(json|md|pdf)$")] = "json") -> Response:
        """The document's outputs once every page is final: JSON (its pages in order), markdown, searchable PDF."""
        service = _service(request)
        row, progress, _ = ingests.document_progress(service.db, document_id, tenant_id=caller.tenant_id)
        key, media = {"json": (row.json_key, "application/json"), "md": (row.markdown_key, "text/markdown"),
                      "pdf": (row.pdf_key, "application/pdf")}[format]
        if not key:
            if progress.done and row.json_key and format == "pdf":
                raise ApiError(404, "not_found", "no searchable PDF could be made for this document")
            raise ApiError(409, "not_ready", "the document is not finished yet" if not progress.done
                           else "the document's outputs are being written", {"Retry-After": "1"})
        suffix = {"json": "json", "md": "md", "pdf": "pdf"}[format]
        return Response(service.store.get(key), media_type=media, headers={
            "Content-Disposition": f'inline; filename="{_header_safe(row.name)}.{suffix}"'})

    @app.get("/v1/pages/{page_id}", tags=["pages"])
    def get_page(request: Request, page_id: str, caller: CallerDep) -> dict[str, Any]:
        """A page: its status and, once final, its result."""
        service = _service(request)
        found = ingests.get_page(service.db, page_id, tenant_id=caller.tenant_id)
        return _page_view(service, found.page.id, found.document.id, found.page.page_no, found.job,
                          found.document.source, with_result=True)

    @app.get("/v1/pages/{page_id}/annotated", tags=["pages"])
    def get_annotated(request: Request, page_id: str, caller: CallerDep) -> Response:
        """The page's annotated image (its lines drawn on it)."""
        service = _service(request)
        found = ingests.get_page(service.db, page_id, tenant_id=caller.tenant_id)
        key = found.job.annotated_key
        if not key:
            raise ApiError(404, "not_found", "this page has no annotated image")
        media = "image/jpeg" if key.endswith(".jpg") else f"image/{key.rsplit('.', 1)[-1]}"
        return Response(service.store.get(key), media_type=media, headers={"Cache-Control": "private, max-age=300"})

    @app.get("/v1/documents/{document_id}/events", tags=["documents"])
    async def document_events(request: Request, document_id: str, caller: CallerDep) -> StreamingResponse:
        """Server-Sent Events: ``page`` as each page finishes (with its result), then ``done``."""
        service = _service(request)
        await to_thread.run_sync(partial(ingests.document_progress, service.db, document_id,
                                         tenant_id=caller.tenant_id))  # 404 before the stream starts
        return StreamingResponse(_events(request, service, document_id, caller), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _db_ready(db: Database) -> None:
    with db.session() as s:
        s.execute(text("SELECT 1"))


def _header_safe(name: str) -> str:
    return "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in name)[:100] or "document"


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def _events(request: Request, service: Service, document_id: str, caller: Caller) -> AsyncIterator[bytes]:
    sent: set[str] = set()
    last = time.monotonic()
    while not await request.is_disconnected():
        pages = await to_thread.run_sync(ingests.document_pages, service.db, document_id)
        document = await to_thread.run_sync(ingests.get_document, service.db, document_id)
        for page, job in pages:
            if page.id not in sent and JobStatus(job.status).terminal:
                view = await to_thread.run_sync(partial(_page_view, service, page.id, document_id, page.page_no, job,
                                                        document.source, with_result=True))
                sent.add(page.id)
                last = time.monotonic()
                yield _sse("page", view)
        if pages and len(sent) == len(pages) and (document.json_key or _outputs_late(document)):
            final = await to_thread.run_sync(partial(ingests.document_progress, service.db, document_id,
                                                     tenant_id=caller.tenant_id))
            yield _sse("done", _document_view(*final))
            return
        if time.monotonic() - last > _KEEPALIVE:
            last = time.monotonic()
            yield b": keepalive\n\n"
        await asyncio.sleep(_POLL)


def _outputs_late(document: DocumentRow) -> bool:
    """Every page is final but the outputs are not written 10 s on: end the stream without them."""
    finished = document.finished_at
    if finished is None:
        return False
    at = as_utc(finished)
    return at is not None and (utcnow() - at).total_seconds() > 10


def serve(settings: Settings, *, host: str, port: int) -> None:
    """Run the API with uvicorn (``paperlane api``)."""
    import uvicorn

    uvicorn.run(create_app(settings), host=host, port=port, log_level=settings.log_level.lower(),
                proxy_headers=True, server_header=False)

