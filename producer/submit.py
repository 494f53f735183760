"""Submission: documents -> originals in object storage, ingest/document/page/job rows, messages.

A stream of documents (``producer.inputs``) is registered a chunk at a time: originals are
uploaded on a thread pool while reading goes on (small ones packed together, one PUT for hundreds of
pages), then the chunk's jobs, documents and pages are inserted in one transaction and its new work
published in one go, on a thread of its own while the next chunk is read (one chunk at a time, in order).
Memory is bounded by two chunks and the uploads in flight, not the ingest.

A page's job is keyed by its original's content hash, its page number in it and what is asked of
it, so a page that occurs in several documents is one job: a queued, running or succeeded job is
left alone, a failed one is queued again (or any one, with ``force``), and one whose message never
reached the broker (it was down) is published now. An ingest interrupted and started again with the
same sources resumes: the documents it registered are not read into the store again. A document whose
pages are all final when it is registered has its outputs due from that registration, like any other.

An API tenant's ingest reserves each document's pages from the tenant's budget (``PageBudget``) once they are
counted and before the document is stored, out of a block of up to ``RESERVE_AHEAD`` pages reserved at once (one
conditional UPDATE for many documents; only what is missing when a block does not fit, so a block never refuses a
document that fits); a document with more pages than the whole budget is refused, and what was reserved and never
registered (the submit stopped, or the block's rest) is given back, unless ``register_fitting`` asks for the
documents staged before the budget ran out to be registered first (the API's S3 ingests, which continue later).

Every message carries the ingest's fair share (its tenant, the tenant's weight, the ingest's weight), by which
its page waits in its lane (``priority.fair``).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Protocol

from paperlane.errors import InputError, MonthlyBudgetUsed, OverBudget, public_reason
from paperlane.priority.fair import Share
from paperlane.priority.lanes import Lane, message_priority
from paperlane.priority.messages import PageMessage
from paperlane.producer.input_items import Document, Skipped
from paperlane.schemas import Stage, TaskSpec, check_weight
from paperlane.settings import IngestSettings
from paperlane.status import JobStatus, PageState
from paperlane.storage import ingests, tenants, timeids
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database, utcnow
from paperlane.storage.ingests import NewDocument, NewPage
from paperlane.storage.objects import ObjectStore, original_key, pack_key, ranged

if TYPE_CHECKING:  # imports Celery: `paperlane run` publishes nothing and need not load it
    from paperlane.priority.broker import PagePublisher

log = logging.getLogger(__name__)

PACK_BELOW = 1 << 20  # originals smaller than this share a pack object
PACK_BYTES = 8 << 20  # a pack is uploaded when it holds this much
CHUNK_PAGES = 500  # pages registered per transaction
IN_FLIGHT_BYTES = 256 << 20  # originals read and not yet uploaded
RESERVE_AHEAD = 64  # pages of a tenant's budget reserved at once, for the documents to come (given back if unused)


class SubmitAction(str, Enum):
    """What registering a page did about its job."""

    QUEUED = PageState.QUEUED.value  # a new job (or one whose message never went out), published
    REQUEUED = "requeued"  # a failed job (or any, with force) queued again
    EXISTS = "exists"  # queued, running or done already: left as it is
    REFUSED = JobStatus.FAILED.value  # the document was refused: its page's job failed at registration


class PageBudget(Protocol):
    def reserve(self, pages: int) -> None:
        """Reserve ``pages`` more pages in flight. Raises OverBudget (not retryable: more than the whole budget)."""
        ...

    def release(self, pages: int) -> None:
        """Give back pages reserved and never registered."""
        ...


@dataclass
class SubmittedPage:
    """One page of a registered document and what submission did about its job."""

    ingest_id: str
    document_id: str
    page_id: str
    source: str  # the document's source
    name: str  # the document's output stem
    page_no: int
    page_count: int
    job_id: str
    lane: Lane
    status: JobStatus  # the job's state once registered
    action: SubmitAction
    error: str | None = None  # the document was refused: why


@dataclass
class IngestSummary:
    ingest_id: str = ""
    resumed: bool = False
    documents: int = 0
    pages: int = 0
    skipped: int = 0
    skipped_before: int = 0  # documents an interrupted run of this ingest registered already
    actions: dict[str, int] = field(default_factory=dict)


def job_key(content_sha256: str, page_no: int, spec: TaskSpec, tenant_id: str | None = None) -> str:
    """The work item's key: same bytes, page and task = one job. An API tenant's jobs are its own (no tenant
    learns from a page finishing at once that another one sent the same bytes)."""
    scope = f"tenant:{tenant_id}:" if tenant_id else ""
    return hashlib.sha256(f"{scope}{content_sha256}:{page_no}:{spec.cache_key()}".encode()).hexdigest()


def job_id_for(key: str) -> str:
    """A new job's id: time-first (its month's partition); registration keeps the id of a key seen before."""
    return timeids.mint(name=key)


@dataclass
class _Doc:
    """A document of the current chunk: its rows, and its upload while it runs."""

    row: NewDocument
    data_sha: str
    upload_s: float
    upload: Future[None] | None = None
    span: tuple[int, int] | None = None  # its bytes in the pack being filled
    reserved: int = 0  # its pages reserved from the tenant's budget


class Submitter:
    """Registers documents into one ingest; iterate ``submit`` to drive it."""

    def __init__(self, *, db: Database, store: ObjectStore, spec: TaskSpec, lane: Lane = Lane.BATCH,
                 priority: int = 0, force: bool = False, publisher: PagePublisher | None = None,
                 limits: IngestSettings | None = None, resume: bool = True, chunk_pages: int = CHUNK_PAGES,
                 owner: ingests.Owner | None = None, uploads: ThreadPoolExecutor | None = None,
                 pages: PageBudget | None = None, weight: float = 1.0, register_fitting: bool = False) -> None:
        check_weight(weight, whose="an ingest's")
        self.db, self.store, self.spec, self.lane, self.force = db, store, spec, lane, force
        self.weight = weight
        self.share = Share()
        self.owner = owner or ingests.Owner()
        self.message_priority = message_priority(lane, priority)
        self.task_options = spec.model_dump(mode="json", exclude={"task"})
        self.publisher = publisher
        self.limits = limits or IngestSettings()
        self.resume = resume
        self.chunk_pages = chunk_pages
        self.summary = IngestSummary()
        # A long-lived caller (the API) lends its pool: a pool of one's own starts threads for every submit.
        self._own_uploads = uploads is None
        self._uploads = uploads or ThreadPoolExecutor(max_workers=self.limits.upload_threads,
                                                      thread_name_prefix="upload")
        self._room = threading.BoundedSemaphore(IN_FLIGHT_BYTES >> 16)  # in 64 kB units
        self._pack = bytearray()
        self._pack_docs: list[_Doc] = []
        self.pages = pages
        self.register_fitting = register_fitting  # out of budget: register the documents staged so far, then stop
        self._reserved = 0  # pages reserved for documents staged and not registered yet
        self._ahead = 0  # pages reserved for documents not read yet (``_take``)
        self._block = RESERVE_AHEAD  # how many pages the next reservation asks for
        # One chunk is registered on this thread while the next one is read (``_hand_over``).
        self._registrar = ThreadPoolExecutor(max_workers=1, thread_name_prefix="register")
        self._registering: Future[tuple[list[SubmittedPage], int]] | None = None

    def submit(self, items: Iterable[Document | Skipped], *, name: str,
               sources: list[str]) -> Iterator[SubmittedPage | Skipped]:
        """Register every document of ``items`` into the ingest ``name``; yields each page (and each
        skipped file) as its chunk is registered. The ingest is closed when ``items`` ends."""
        ingest_id = self.summary.ingest_id or self.open(name=name, sources=sources)
        known = ingests.registered_sources(self.db, ingest_id) if self.summary.resumed and self.resume else set()
        if known:
            self._publish_unpublished(ingest_id)
        try:
            yield from self._chunks(ingest_id, items, known)
        finally:
            self._abandon_registering()
            self._registrar.shutdown(wait=True)
            if self._own_uploads:
                self._uploads.shutdown(wait=True, cancel_futures=True)
            if self.pages is not None and self._reserved + self._ahead:
                self.pages.release(self._reserved + self._ahead)
                self._reserved = self._ahead = 0
        ingests.close_ingest(self.db, ingest_id, skipped=self.summary.skipped)

    def open(self, *, name: str, sources: list[str]) -> str:
        """Open the ingest now (``submit`` does it otherwise), to know its id before anything is read."""
        key = ingests.ingest_key(name=name, sources=sources, lane=self.lane.value, task_key=self.spec.cache_key())
        ingest, resumed = ingests.open_ingest(self.db, key=key, name=name, lane=self.lane.value,
                                              task=self.spec.task.value, task_options=self.task_options,
                                              owner=self.owner, weight=self.weight)
        self.summary.ingest_id, self.summary.resumed = ingest.id, resumed
        self.share = Share.of(self.owner.tenant_id, ingest.id, tenants.weight_of(self.db, self.owner.tenant_id),
                              ingest.weight)
        return ingest.id

    def _chunks(self, ingest_id: str, items: Iterable[Document | Skipped],
                known: set[str]) -> Iterator[SubmittedPage | Skipped]:
        chunk: list[_Doc] = []
        pages = 0
        seq = ingests.next_seq(self.db, ingest_id) if self.summary.resumed else 0
        for item in items:
            if isinstance(item, Skipped):
                self.summary.skipped += 1
                yield item
                continue
            if item.source in known:
                self.summary.skipped_before += 1
                continue
            try:
                chunk.append(self._stage(ingest_id, seq, item))
            except OverBudget:
                if chunk and self.register_fitting:  # what fits is registered: run again, the submit resumes after it
                    yield from self._hand_over(ingest_id, chunk)
                yield from self._registered()
                raise
            seq += 1
            pages += chunk[-1].row.pages_total
            if pages >= self.chunk_pages:
                yield from self._hand_over(ingest_id, chunk)
                chunk, pages = [], 0
        if chunk:
            yield from self._hand_over(ingest_id, chunk)
        yield from self._registered()

    def _hand_over(self, ingest_id: str, chunk: list[_Doc]) -> list[SubmittedPage]:
        """Start registering ``chunk`` on the registrar thread, once the chunk before it is registered: its pages are
        returned (its error raised). The next chunk is read and stored meanwhile: registering waits on the database,
        the broker and the last uploads, reading on the files, and neither waits for the other."""
        self._flush_pack(ingest_id)
        before = self._registered()
        self._registering = self._registrar.submit(self._register, ingest_id, chunk)
        return before

    def _registered(self) -> list[SubmittedPage]:
        """The pages of the chunk being registered, once it is (raises what registering it raised)."""
        pending, self._registering = self._registering, None
        if pending is None:
            return []
        pages, reserved = pending.result()
        self._reserved -= reserved
        return pages

    def _abandon_registering(self) -> None:
        """The submit stops (an error, or its caller stopped iterating): the chunk being registered is waited for,
        so that what it reserved is counted once, as registered or as given back."""
        try:
            self._registered()
        except Exception:  # noqa: BLE001 - the error that stopped the submit is the one raised
            log.warning("registering the last chunk failed as the submit stopped", exc_info=True)

    def _stage(self, ingest_id: str, seq: int, doc: Document) -> _Doc:
        """The document's rows, its original on its way to the store (its pages reserved first)."""
        t0 = time.perf_counter()
        doc, reserved = self._reserve(doc)
        sha = hashlib.sha256(doc.data).hexdigest() if doc.error is None else ""
        row = NewDocument(id=ingests.document_id_for(ingest_id, doc.source), seq=seq, source=doc.source,
                          name=doc.name, ext=doc.ext[:16], pages_total=max(1, doc.page_count))
        staged = _Doc(row, sha, doc.read_s, reserved=reserved)
        if doc.error is not None:
            row.error = public_reason(doc.error)
            row.pages_total = 1
        elif len(doc.data) < PACK_BELOW:
            self._pack_docs.append(staged)
            staged.span = (len(self._pack), len(self._pack) + len(doc.data))
            self._pack += doc.data
            if len(self._pack) >= PACK_BYTES:
                self._flush_pack(ingest_id)
        else:
            row.original_key = original_key(sha, doc.ext)
            staged.upload = self._upload(row.original_key, doc.data)
        row.content_sha256 = sha or None
        staged.upload_s += time.perf_counter() - t0
        return staged

    def _reserve(self, doc: Document) -> tuple[Document, int]:
        """Reserve the document's pages (a refused one's one page) from the tenant's budget; a document with more
        pages than the whole budget is refused. Raises OverBudget when they do not fit now."""
        if self.pages is None:
            return doc, 0
        pages = 1 if doc.error is not None else doc.page_count
        try:
            self._take(pages)
        except OverBudget as exc:
            if exc.retryable:
                raise
            doc = Document(doc.source, doc.name, doc.ext, b"", 1, InputError(str(exc), stage=Stage.UPLOAD.value))
            pages = 1
            self._take(pages)
        self._reserved += pages
        return doc, pages

    def _take(self, pages: int) -> None:
        """Take ``pages`` from those reserved ahead, reserving more first when too few are left: a block (one UPDATE
        for many documents), or only what is missing when the block does not fit (then the next block is smaller).
        Raises what ``PageBudget.reserve`` raises for what is missing (OverBudget names the document's pages)."""
        assert self.pages is not None
        missing = pages - self._ahead
        if missing > 0:
            block = max(missing, self._block)
            try:
                self.pages.reserve(block)
                self._block = min(RESERVE_AHEAD, self._block * 2)
            except (OverBudget, MonthlyBudgetUsed):
                if block == missing:
                    raise
                self._block = max(1, self._block // 4)
                self._reserve_missing(pages, missing)
                block = missing
            self._ahead += block
        self._ahead -= pages

    def _reserve_missing(self, pages: int, missing: int) -> None:
        assert self.pages is not None
        try:
            self.pages.reserve(missing)
        except OverBudget as exc:
            if exc.retryable:
                raise
            raise OverBudget(asked=pages, in_flight=exc.in_flight, cap=exc.cap) from exc

    def _upload(self, key: str, data: bytes | bytearray) -> Future[None]:
        units = max(1, min(len(data) >> 16, IN_FLIGHT_BYTES >> 16))
        for _ in range(units):
            self._room.acquire()

        def put() -> None:
            try:
                self.store.put(key, bytes(data))
            finally:
                for _ in range(units):
                    self._room.release()
        return self._uploads.submit(put)

    def _flush_pack(self, ingest_id: str) -> None:
        if not self._pack_docs:
            return
        key = pack_key(ingest_id, uuid.uuid4().hex)
        upload = self._upload(key, self._pack)
        for doc in self._pack_docs:
            assert doc.span is not None
            doc.row.original_key = ranged(key, *doc.span)
            doc.upload = upload
        self._pack, self._pack_docs = bytearray(), []

    def _register(self, ingest_id: str, chunk: list[_Doc]) -> tuple[list[SubmittedPage], int]:
        """Register ``chunk`` (on the registrar thread): its pages, and the pages of the budget it had reserved."""
        t0 = time.perf_counter()
        for doc in chunk:
            if doc.upload is not None:
                doc.upload.result()  # StorageUnavailable: the submit stops, and resumes when run again
        wait_s = (time.perf_counter() - t0) / max(1, len(chunk))
        jobs, pages, refs = [], [], []
        for doc in chunk:
            for page_no in range(1, doc.row.pages_total + 1):
                job = self._job_row(doc, page_no, upload_s=doc.upload_s + wait_s)
                page = NewPage(id=ingests.page_id_for(doc.row.id, page_no), document_id=doc.row.id,
                               page_no=page_no, job_id=job["id"])
                jobs.append(job)
                pages.append(page)
                refs.append((doc, page))
        reserved = sum(d.reserved for d in chunk)
        found = ingests.register(self.db, ingest_id, jobs=jobs, documents=[d.row for d in chunk], pages=pages,
                                 reserved=reserved)
        actions = self._settle(found, {p.job_id for d, p in refs if d.row.error is not None})
        self.summary.documents += len(found.new_documents)
        self.summary.pages += len(pages)
        out = []
        for doc, page in refs:
            action, status = actions[page.job_id]
            self.summary.actions[action.value] = self.summary.actions.get(action.value, 0) + 1
            out.append(SubmittedPage(ingest_id=ingest_id, document_id=doc.row.id, page_id=page.id,
                                     source=doc.row.source, name=doc.row.name, page_no=page.page_no,
                                     page_count=doc.row.pages_total, job_id=page.job_id, lane=self.lane,
                                     status=status, action=action, error=doc.row.error))
        return out, reserved

    def _job_row(self, doc: _Doc, page_no: int, *, upload_s: float) -> dict:
        if doc.row.error is not None:  # refused: a failed job of its own, keyed by what was refused and why
            scope = f"tenant:{self.owner.tenant_id}:" if self.owner.tenant_id else ""
            key = hashlib.sha256(f"{scope}refused:{doc.row.source}:{doc.row.error}".encode()).hexdigest()
            status, error, stage = JobStatus.FAILED.value, doc.row.error, Stage.UPLOAD.value
        else:
            key = job_key(doc.data_sha, page_no, self.spec, self.owner.tenant_id)
            status, error, stage = JobStatus.QUEUED.value, None, None
        now = utcnow()
        return dict(id=job_id_for(key), job_key=key, content_sha256=doc.data_sha or key, source=doc.row.source,
                    page=page_no, lane=self.lane.value, priority=self.message_priority, task=self.spec.task.value,
                    task_options=self.task_options, status=status, attempts=0,
                    error=error, error_stage=stage, original_key=doc.row.original_key, upload_s=upload_s,
                    created_at=now, updated_at=now, finished_at=now if error else None)

    def _settle(self, found: ingests.Registered, refused: set[str]) -> dict[str, tuple[SubmitAction, JobStatus]]:
        """What happens to each job of the chunk: published, requeued, or left as it is."""
        actions: dict[str, tuple[SubmitAction, JobStatus]] = {}
        publish: list[str] = []
        for job_id, status in found.job_status.items():
            if job_id in refused:
                actions[job_id] = (SubmitAction.REFUSED, status)
            elif job_id in found.new_jobs or job_id in found.unpublished:
                actions[job_id] = (SubmitAction.QUEUED, status)
                publish.append(job_id)
            elif (self.force or status is JobStatus.FAILED) and status.terminal:
                jobstore.requeue(self.db, job_id)
                actions[job_id] = (SubmitAction.REQUEUED, JobStatus.QUEUED)
                publish.append(job_id)
            else:
                actions[job_id] = (SubmitAction.EXISTS, status)
        if self.publisher is not None and publish:
            self.publisher.publish([self._message(j, self.lane, self.message_priority) for j in publish])
            jobstore.mark_enqueued(self.db, publish)
        return actions

    def _message(self, job_id: str, lane: Lane, message_priority: int) -> PageMessage:
        return PageMessage(job_id=job_id, lane=lane, message_priority=message_priority, share=self.share)

    def _publish_unpublished(self, ingest_id: str) -> None:
        """Jobs an interrupted submit registered and never published."""
        if self.publisher is None:
            return
        work = ingests.unpublished_work(self.db, ingest_id)
        for i in range(0, len(work), self.chunk_pages):
            part = work[i:i + self.chunk_pages]
            self.publisher.publish([self._message(job_id, Lane(lane), msg_priority)
                                    for job_id, lane, msg_priority in part])
            jobstore.mark_enqueued(self.db, [job_id for job_id, _, _ in part])


def submit_documents(documents: Iterable[Document], *, db: Database, store: ObjectStore, spec: TaskSpec,
                     lane: Lane = Lane.BATCH, priority: int = 0, force: bool = False,
                     publisher: PagePublisher | None = None, name: str | None = None,
                     owner: ingests.Owner | None = None, weight: float = 1.0) -> list[SubmittedPage]:
    """Register ``documents`` as one new ingest and return their pages (for callers with a few documents)."""
    submitter = Submitter(db=db, store=store, spec=spec, lane=lane, priority=priority, force=force,
                          publisher=publisher, owner=owner, weight=weight)
    name = name or f"submit {uuid.uuid4()}"
    return [p for p in submitter.submit(documents, name=name, sources=[]) if isinstance(p, SubmittedPage)]
