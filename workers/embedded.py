"""``paperlane run``: the whole pipeline, on the embedded stack by default.

Pages are registered exactly as ``paperlane submit`` does (originals in the object store, rows
in the database) and flow through the same pieces as on a worker: page slots on threads (of this process, or of
feeding processes of their own: ``workers.run_feeders``; one lane scheduler here hands out every page), the
CPU pool preparing pages while the engine runs, the micro-batcher, the lane policy choosing what
starts next, the same attempt runner (``attempts.AttemptRunner``: claim, prepare, infer, post-process, store,
settle by the retry policy; its delayed pages kept in memory instead of Redis), the same recorded document
outputs. Inputs are read lazily, so a run over millions of pages holds only a few
slots' worth in memory. Pages done earlier with the same content and task are not redone: their
stored result is copied out.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from paperlane.errors import PaperlaneError
from paperlane.formats import Content, build, file_name, format_of, lookup
from paperlane.priority.delayed import InMemoryDelayed
from paperlane.priority.lanes import Lane
from paperlane.priority.messages import PageMessage
from paperlane.priority.policy import LanePolicy
from paperlane.priority.scheduler import InMemoryLanes, LaneScheduler
from paperlane.producer.input_items import Document, Skipped
from paperlane.producer.submit import SubmitAction, SubmittedPage, Submitter
from paperlane.retry import Action, RetryPolicy
from paperlane.schemas import JobStatus, OutputFormat, PageResult, TaskSpec
from paperlane.settings import ImageFormat, Settings
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database
from paperlane.storage.objects import ObjectStore, open_store
from paperlane.storage.results import document_content, page_result
from paperlane.workers.attempts import AttemptRunner
from paperlane.workers.outputs import DocumentOutputs
from paperlane.workers.outputs_pool import OutputsPool, writer_of
from paperlane.workers.pipeline import Runtime

log = logging.getLogger(__name__)

_PAGE_FILE = OutputFormat.JSON  # what each page is written as, as it finishes (a one-page document's JSON is it)


@dataclass
class RunSummary:
    """What a run did, kept small: a run over millions of pages must not hold their results."""

    pages: int = 0
    failed: int = 0
    documents: int = 0
    skipped: int = 0  # files in folders and archives that hold no pages (unsupported types, links)
    timings: list[dict[str, float]] = field(default_factory=list)  # per page, seconds per stage
    seconds: float = 0.0
    stopped: str | None = None  # why the run stopped before its last page (a feeding process died), or None


@dataclass(frozen=True)
class Handout:
    """A page handed to a feeding slot, with the name its files get in the out folder."""

    page: SubmittedPage
    name: str


@dataclass(frozen=True)
class Reported:
    """What a feeding slot says about a page it was handed, kept small (it crosses from a feeding process): the retry
    policy's word, and what the run counts and prints. The page's files are in the out folder already.

    ``action`` None: the page needed no attempt (final already): the run reports what its row says. ``lost``: its
    feeding process died holding it; its row is queued again for the next run."""

    job_id: str
    action: Action | None
    delay: float = 0.0
    status: JobStatus = JobStatus.FAILED
    error: str | None = None
    lines: int = 0
    chars: int = 0
    truncated: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    lost: bool = False

    @classmethod
    def of(cls, result: PageResult, action: Action | None = None) -> Reported:
        return cls(result.job_id, action, status=result.status, error=result.error, lines=len(result.lines),
                   chars=len(result.text), truncated=result.truncated, timings=result.timings)


class Host(Protocol):
    """What a run needs beside its feeding slots: settings, database, store, the document outputs' processes (a
    ``Runtime``, or ``RunHost`` when the pages are fed by processes of their own)."""

    settings: Settings
    db: Database
    store: ObjectStore
    outputs: OutputsPool


@dataclass
class RunHost:
    """A run's ``Host`` without an engine: its pages are fed by other processes (``workers.run_feeders``)."""

    settings: Settings
    db: Database
    store: ObjectStore
    outputs: OutputsPool

    @classmethod
    def open(cls, settings: Settings) -> RunHost:
        """Open the database (migrated: before any feeding process opens it), the store and the outputs' pool."""
        db = Database(settings.database_url, pool_size=settings.database.pool_size, echo=settings.database.echo)
        db.upgrade()
        store = open_store(settings)
        return cls(settings, db, store, OutputsPool(settings, writer_of(settings, db, store)))

    def close(self) -> None:
        self.outputs.close()
        self.db.dispose()


class Feed(Protocol):
    """Where a run's pages are attempted: slots on threads of this process (``ThreadFeed``), or feeding processes
    (``workers.run_feeders.RunFeeders``). The run's one lane scheduler decides what each free slot gets."""

    @property
    def slots(self) -> int:
        """Pages it works on at once (so far: feeding processes that have not started yet have none)."""
        ...

    def free(self) -> bool:
        """Whether a slot is free for one more page."""
        ...

    def hand(self, handout: Handout) -> None:
        """Start the page's attempt on a free slot."""
        ...

    def reports(self, timeout: float | None) -> list[tuple[Handout, Reported]]:
        """What slots reported since the last call, waiting up to ``timeout`` seconds (None: until something
        happens) for the first; may be empty. Raises what an attempt raised that left nothing recorded."""
        ...

    @property
    def broken(self) -> str | None:
        """Why no page can be handed any more (a feeding process died), or None."""
        ...


def attempt_page(runner: AttemptRunner, out_dir: Path, handout: Handout) -> Reported:
    """One attempt at a handed page, on a feeding slot: its files written into ``out_dir`` once final, reported."""
    attempt = runner.run(_message(handout.page))
    if attempt is None:
        return Reported(handout.page.job_id, None)
    decision = attempt.decision
    if decision.action is Action.RETRY:
        return Reported(handout.page.job_id, Action.RETRY, delay=decision.delay)
    result = attempt.outcome.result
    write_page_files(out_dir, handout, result, attempt.outcome.annotated,
                     image_format=runner.rt.settings.worker.annotated_format)
    return Reported.of(result, decision.action)


def write_page_files(out_dir: Path, handout: Handout, result: PageResult, image: bytes | None, *,
                     image_format: ImageFormat) -> None:
    """A page's JSON and, on success, its annotated image, named ``handout.name``."""
    page = handout.page
    result = result.model_copy(update={"source": page.source, "page": page.page_no})
    (out_dir / file_name(handout.name, _PAGE_FILE)).write_bytes(build(_PAGE_FILE, Content([result]), page=result.page))
    if image is not None:
        # A page done by an earlier run may have been stored in another format: its bytes say which.
        # "<name>.annotated.jpg", never "<name>.jpg": run with --out on the input folder must not
        # overwrite the scans themselves.
        (out_dir / file_name(handout.name, format_of(image) or image_format)).write_bytes(image)


class ThreadFeed:
    """The ``Feed`` of one process: ``rt.slots`` page slots on threads, the engine in this process."""

    def __init__(self, rt: Runtime, out_dir: Path) -> None:
        # No crash-loop limit here: a page that kills this process stops the run where the user sees it, and an
        # interrupted run (Ctrl-C) must not count against the pages it was working on. The run writes document
        # outputs itself, once their pages are out (``_OutputWriter``).
        self.runner = AttemptRunner(rt, RetryPolicy.of(rt.settings.worker), crash_limit=False)
        self.out_dir, self.slots, self.in_flight = out_dir, rt.slots, 0  # an attribute: the protocol's property
        self.pool = ThreadPoolExecutor(max_workers=rt.slots, thread_name_prefix="slot")
        self.done: queue.Queue[tuple[Handout, Future[Reported]]] = queue.Queue()

    def free(self) -> bool:
        return self.in_flight < self.slots

    def hand(self, handout: Handout) -> None:
        fut = self.pool.submit(attempt_page, self.runner, self.out_dir, handout)
        fut.add_done_callback(lambda f: self.done.put((handout, f)))
        self.in_flight += 1

    def reports(self, timeout: float | None) -> list[tuple[Handout, Reported]]:
        try:
            handout, fut = self.done.get(timeout=timeout)
        except queue.Empty:
            return []
        self.in_flight -= 1
        return [(handout, fut.result())]

    @property
    def broken(self) -> str | None:
        return None

    def close(self) -> None:
        self.pool.shutdown()


def run_embedded(rt: Host, items: Iterable[Document | Skipped], *, out_dir: Path, spec: TaskSpec,
                 lane: Lane = Lane.BATCH, force: bool = False, name: str = "run", sources: list[str] | None = None,
                 feed: Feed | None = None, on_page: Callable[[str, Reported], None] | None = None,
                 on_skipped: Callable[[Skipped], None] | None = None) -> RunSummary:
    """Process every document of ``items`` and write, into ``out_dir``, each page's ``<stem>.json`` (and
    its annotated image on success) and each document's outputs in ``worker.output_formats``, named as
    ``paperlane.formats.file_name`` names them: ``<stem>.md``, ``<stem>.pdf``, ``<stem>.alto.xml``, ...,
    a page's PAGE XML ``<stem>-p<N>.page.xml`` when the document has several, and for several pages the
    document's ``<stem>.json`` (a one-page document's JSON is its page's).

    ``feed``: where pages are attempted (default: slots on threads of this process, ``rt`` a ``Runtime``)."""
    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = RunSummary()
    writer = _OutputWriter(rt, out_dir, summary, on_page)
    submitter = Submitter(db=rt.db, store=rt.store, spec=spec, lane=lane, force=force, limits=rt.settings.ingest,
                          resume=False)

    def pages() -> Iterator[SubmittedPage]:
        for item in submitter.submit(items, name=name, sources=sources or []):
            if isinstance(item, Skipped):
                summary.skipped += 1
                if on_skipped:
                    on_skipped(item)
            else:
                yield item

    own = None
    if feed is None:
        assert isinstance(rt, Runtime), "a run without feeding processes needs a Runtime"
        feed = own = ThreadFeed(rt, out_dir)
    try:
        summary.stopped = _Scheduler(rt, pages(), feed, writer).run()
    finally:
        if own is not None:
            own.close()
    rt.outputs.drain()
    summary.seconds = time.perf_counter() - t0
    return summary


class _OutputWriter:
    """Names each page's files as it is handed out, counts it (and writes its files, for a page that needed no
    attempt) as it finishes, and has a document's files written once its last page has."""

    def __init__(self, rt: Host, out_dir: Path, summary: RunSummary,
                 on_page: Callable[[str, Reported], None] | None) -> None:
        self.rt, self.out_dir, self.summary, self.on_page = rt, out_dir, summary, on_page
        self.used: set[str] = set()  # output stems taken in this run
        self.stems: dict[str, str] = {}  # document id -> its stem
        self.left: dict[str, int] = {}  # document id -> pages not written yet

    def handout(self, page: SubmittedPage) -> Handout:
        stem = self._stem(page)
        return Handout(page, stem if page.page_count == 1 else f"{stem}-p{page.page_no}")

    def emit(self, handout: Handout, result: PageResult, image: bytes | None) -> None:
        """A page's files written here, and the page counted."""
        write_page_files(self.out_dir, handout, result, image,
                         image_format=self.rt.settings.worker.annotated_format)
        self.record(handout, Reported.of(result))

    def record(self, handout: Handout, reported: Reported) -> None:
        """A final page counted (its files written already); its document's outputs once it was the last."""
        self.summary.pages += 1
        self.summary.failed += reported.status is not JobStatus.SUCCEEDED
        self.summary.timings.append(reported.timings)
        if self.on_page:
            self.on_page(handout.name, reported)
        page = handout.page
        self.left[page.document_id] -= 1
        if self.left[page.document_id] == 0:
            self._document(page, self.stems[page.document_id])

    def _stem(self, page: SubmittedPage) -> str:
        """The document's output stem, unique in this run: a taken stem (or page name) gets -2, -3, ..."""
        if page.document_id in self.stems:
            return self.stems[page.document_id]
        names = lambda s: {s} if page.page_count == 1 else {s, *(f"{s}-p{i}" for i in range(1, page.page_count + 1))}  # noqa: E731
        stem, n = page.name, 1
        while names(stem) & self.used:
            n += 1
            stem = f"{page.name}-{n}"
        self.used |= names(stem)
        self.stems[page.document_id] = stem
        self.left[page.document_id] = page.page_count
        return stem

    def _document(self, page: SubmittedPage, stem: str) -> None:
        """The document's outputs, built, stored and copied into the out folder off this process
        (``Runtime.outputs``); the run waits for them before it ends. A failure's reason is logged, and recorded on
        the document."""
        self.summary.documents += 1
        self.rt.outputs.write(page.document_id, then=partial(write_run_files, self.out_dir, stem))


def write_run_files(out_dir: Path, stem: str, store: ObjectStore, outputs: DocumentOutputs) -> None:
    """Copy a document's written outputs into a run's ``out_dir``, named after its ``stem``: files that list their
    page files (METS) built again with the stem's names; a one-page document's JSON left out (its page's file,
    written as the page finished, has its name and says it all)."""
    files = dict(outputs.files)
    count = len(outputs.pages)
    if count == 1:
        files.pop((_PAGE_FILE, None), None)
    content = document_content(store, outputs.document, outputs.pages, stem=stem)
    for fmt, number in list(files):
        if lookup(fmt).companions:  # it lists its page files: here they are named after the stem, not the id
            files[(fmt, number)] = build(fmt, content, page=number)
    for (fmt, number), data in files.items():
        (out_dir / file_name(stem, fmt, number, count)).write_bytes(data)


class _Scheduler:
    """Keeps every feeding slot busy; the one ``LaneScheduler`` decides which lane starts next, whichever slot
    (thread or feeding process) takes the page.

    A page whose attempt should be retried waits out its backoff off its slot, in memory, and then goes
    back to its lane: the same policy as on a worker, where it waits in Redis's delayed set. Pages that
    share a job (the same page in several documents) wait for its one attempt.
    """

    def __init__(self, rt: Host, pages: Iterator[SubmittedPage], feed: Feed, writer: _OutputWriter) -> None:
        self.rt, self.pages, self.feed, self.writer = rt, pages, feed, writer
        self.waiting: InMemoryLanes[SubmittedPage] = InMemoryLanes()
        # No interactive page arrives from outside a run: batch pages may use every slot.
        self.lanes = LaneScheduler(LanePolicy(batch_share=rt.settings.worker.batch_share), self.waiting)
        self.delayed: InMemoryDelayed[SubmittedPage] = InMemoryDelayed()  # retries due later
        self.sharing: dict[str, list[SubmittedPage]] = {}  # job id -> pages waiting for its attempt
        self.exhausted = False
        self.in_flight = 0
        self._due_in: float | None = None  # seconds until the next delayed page is due

    def run(self) -> str | None:
        """Run every page; why the run stopped before its last page, or None."""
        while True:
            if self.feed.broken is None:
                self._refill()
                self._release_due()
                self.lanes.refresh()
                while self.feed.free() and (picked := self.waiting.take()) is not None:
                    lane, page = picked
                    self.lanes.started(lane)
                    self.feed.hand(self.writer.handout(page))
                    self.in_flight += 1
                if self.in_flight == 0 and self.exhausted and not len(self.waiting) and not self.delayed.pending():
                    return None
            elif self.in_flight == 0:  # pages still waiting stay queued for the next run
                return self.feed.broken
            for handout, reported in self.feed.reports(self._due_in if self.feed.broken is None else None):
                self.in_flight -= 1
                self.lanes.finished(handout.page.lane)
                self._settled(handout, reported)

    def _refill(self) -> None:
        while not self.exhausted and len(self.waiting) < 2 * max(1, self.feed.slots):
            try:
                page = next(self.pages)
            except StopIteration:
                self.exhausted = True
                return
            if page.action is SubmitAction.REFUSED or (page.action is SubmitAction.EXISTS
                                                       and page.status is JobStatus.SUCCEEDED):
                self.writer.emit(self.writer.handout(page), *_stored(self.rt, page))
            elif page.job_id in self.sharing:  # its job is on its way for another page
                self.sharing[page.job_id].append(page)
            else:  # new, requeued, or left queued/running by an earlier run that stopped
                self.sharing[page.job_id] = []
                self.waiting.add(page.lane, page)

    def _release_due(self) -> None:
        due, self._due_in = self.delayed.claim_due(limit=max(1, self.feed.slots))
        for page in due:
            self.waiting.add(page.lane, page)
        self.delayed.released(due)

    def _settled(self, handout: Handout, reported: Reported) -> None:
        if reported.action is Action.RETRY:
            self.delayed.add(handout.page, reported.delay)
            return
        if reported.action is None:  # finished without an attempt here: report what the row says
            self.writer.emit(handout, *_stored(self.rt, handout.page))
        else:
            self.writer.record(handout, reported)
        for other in self.sharing.pop(handout.page.job_id, []):
            if reported.lost:
                self.writer.record(self.writer.handout(other), reported)
            else:
                self.writer.emit(self.writer.handout(other), *_stored(self.rt, other))


def _message(page: SubmittedPage) -> PageMessage:
    """The page as a worker would be handed it (a run's pages are the command line's: the default share)."""
    return PageMessage(job_id=page.job_id, lane=page.lane, message_priority=page.lane.base_priority)


def _stored(rt: Host, page: SubmittedPage) -> tuple[PageResult, bytes | None]:
    """The result of a page that needs no work now: done earlier, or refused at submission."""
    job = jobstore.get_job(rt.db, page.job_id)
    image = None
    if job.status == JobStatus.SUCCEEDED.value and job.annotated_key:
        try:
            image = rt.store.get(job.annotated_key)
        except PaperlaneError as exc:
            log.warning("stored annotated image of job %s unreadable (%s)", job.id, exc)
    return page_result(rt.store, job, source=page.source, page_no=page.page_no), image
