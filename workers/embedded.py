"""``paperlane run``: the whole pipeline in one process, on the embedded stack by default.

Pages are registered exactly as ``paperlane submit`` does (originals in the object store, rows
in the database) and flow through the same pieces as on a worker: page slots on threads, the
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
from paperlane.storage import jobs as jobstore
from paperlane.storage.objects import ObjectStore
from paperlane.storage.results import document_content, page_result
from paperlane.workers.attempts import Attempt, AttemptRunner
from paperlane.workers.outputs import DocumentOutputs
from paperlane.workers.pipeline import Runtime

log = logging.getLogger(__name__)

Emit = Callable[[SubmittedPage, PageResult, "bytes | None"], None]
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


def run_embedded(rt: Runtime, items: Iterable[Document | Skipped], *, out_dir: Path, spec: TaskSpec,
                 lane: Lane = Lane.BATCH, force: bool = False, name: str = "run", sources: list[str] | None = None,
                 on_page: Callable[[str, PageResult], None] | None = None,
                 on_skipped: Callable[[Skipped], None] | None = None) -> RunSummary:
    """Process every document of ``items`` and write, into ``out_dir``, each page's ``<stem>.json`` (and
    its annotated image on success) and each document's outputs in ``worker.output_formats``, named as
    ``paperlane.formats.file_name`` names them: ``<stem>.md``, ``<stem>.pdf``, ``<stem>.alto.xml``, ...,
    a page's PAGE XML ``<stem>-p<N>.page.xml`` when the document has several, and for several pages the
    document's ``<stem>.json`` (a one-page document's JSON is its page's)."""
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

    _Scheduler(rt, pages(), writer.emit).run()
    rt.outputs.drain()
    summary.seconds = time.perf_counter() - t0
    return summary


class _OutputWriter:
    """Writes each page's files as it finishes, and a document's files once its last page has."""

    def __init__(self, rt: Runtime, out_dir: Path, summary: RunSummary,
                 on_page: Callable[[str, PageResult], None] | None) -> None:
        self.rt, self.out_dir, self.summary, self.on_page = rt, out_dir, summary, on_page
        self.used: set[str] = set()  # output stems taken in this run
        self.stems: dict[str, str] = {}  # document id -> its stem
        self.left: dict[str, int] = {}  # document id -> pages not written yet

    def emit(self, page: SubmittedPage, result: PageResult, image: bytes | None) -> None:
        stem = self._stem(page)
        name = stem if page.page_count == 1 else f"{stem}-p{page.page_no}"
        result = result.model_copy(update={"source": page.source, "page": page.page_no})
        page_file = build(_PAGE_FILE, Content([result]), page=result.page)
        (self.out_dir / file_name(name, _PAGE_FILE)).write_bytes(page_file)
        if image is not None:
            # A page done by an earlier run may have been stored in another format: its bytes say which.
            # "<name>.annotated.jpg", never "<name>.jpg": run with --out on the input folder must not
            # overwrite the scans themselves.
            fmt = format_of(image) or self.rt.settings.worker.annotated_format
            (self.out_dir / file_name(name, fmt)).write_bytes(image)
        self.summary.pages += 1
        self.summary.failed += result.status is JobStatus.FAILED
        self.summary.timings.append(result.timings)
        if self.on_page:
            self.on_page(name, result)
        self.left[page.document_id] -= 1
        if self.left[page.document_id] == 0:
            self._document(page, stem)

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
    """Keeps every page slot busy; the one ``LaneScheduler`` decides which lane starts next.

    A page whose attempt should be retried waits out its backoff off its slot, in memory, and then goes
    back to its lane: the same policy as on a worker, where it waits in Redis's delayed set. Pages that
    share a job (the same page in several documents) wait for its one attempt.
    """

    def __init__(self, rt: Runtime, pages: Iterator[SubmittedPage], emit: Emit) -> None:
        self.rt = rt
        self.pages = pages
        self.emit = emit
        self.slots = rt.slots
        self.waiting: InMemoryLanes[SubmittedPage] = InMemoryLanes()
        # No interactive page arrives from outside a run: batch pages may use every slot.
        self.lanes = LaneScheduler(LanePolicy(batch_share=rt.settings.worker.batch_share), self.waiting)
        # No crash-loop limit here: a page that kills this process stops the run where the user sees it, and an
        # interrupted run (Ctrl-C) must not count against the pages it was working on. The run writes document
        # outputs itself, once their pages are out (``_OutputWriter``).
        self.runner = AttemptRunner(rt, RetryPolicy.of(rt.settings.worker), crash_limit=False)
        self.delayed: InMemoryDelayed[SubmittedPage] = InMemoryDelayed()  # retries due later
        self.sharing: dict[str, list[SubmittedPage]] = {}  # job id -> pages waiting for its attempt
        self.done: queue.Queue[tuple[SubmittedPage, Future[Attempt | None]]] = queue.Queue()
        self.exhausted = False
        self._due_in: float | None = None  # seconds until the next delayed page is due

    def run(self) -> None:
        in_flight = 0
        with ThreadPoolExecutor(max_workers=self.slots, thread_name_prefix="slot") as slots:
            while True:
                self._refill()
                self._release_due()
                self.lanes.refresh()
                while in_flight < self.slots and (picked := self.waiting.take()) is not None:
                    lane, page = picked
                    self.lanes.started(lane)
                    fut = slots.submit(self.runner.run, _message(page))
                    fut.add_done_callback(partial(self._done, page))
                    in_flight += 1
                if in_flight == 0 and self.exhausted and not len(self.waiting) and not self.delayed.pending():
                    return
                try:
                    page, fut = self.done.get(timeout=self._due_in)
                except queue.Empty:
                    continue  # a delayed page is due
                in_flight -= 1
                self.lanes.finished(page.lane)
                self._settled(page, fut.result())

    def _done(self, page: SubmittedPage, fut: Future[Attempt | None]) -> None:
        self.done.put((page, fut))

    def _refill(self) -> None:
        while not self.exhausted and len(self.waiting) < 2 * self.slots:
            try:
                page = next(self.pages)
            except StopIteration:
                self.exhausted = True
                return
            if page.action is SubmitAction.REFUSED or (page.action is SubmitAction.EXISTS
                                                       and page.status is JobStatus.SUCCEEDED):
                self.emit(page, *_stored(self.rt, page))
            elif page.job_id in self.sharing:  # its job is on its way for another page
                self.sharing[page.job_id].append(page)
            else:  # new, requeued, or left queued/running by an earlier run that stopped
                self.sharing[page.job_id] = []
                self.waiting.add(page.lane, page)

    def _release_due(self) -> None:
        due, self._due_in = self.delayed.claim_due(limit=self.slots)
        for page in due:
            self.waiting.add(page.lane, page)
        self.delayed.released(due)

    def _settled(self, page: SubmittedPage, attempt: Attempt | None) -> None:
        if attempt is not None and attempt.decision.action is Action.RETRY:
            self.delayed.add(page, attempt.decision.delay)
            return
        if attempt is None:  # finished without an attempt here: report what the row says
            result, image = _stored(self.rt, page)
        else:
            result, image = attempt.outcome.result, attempt.outcome.annotated
        self.emit(page, result, image)
        for other in self.sharing.pop(page.job_id, []):
            self.emit(other, result, image)


def _message(page: SubmittedPage) -> PageMessage:
    """The page as a worker would be handed it (a run's pages are the command line's: the default share)."""
    return PageMessage(job_id=page.job_id, lane=page.lane, message_priority=page.lane.base_priority)


def _stored(rt: Runtime, page: SubmittedPage) -> tuple[PageResult, bytes | None]:
    """The result of a page that needs no work now: done earlier, or refused at submission."""
    job = jobstore.get_job(rt.db, page.job_id)
    image = None
    if job.status == JobStatus.SUCCEEDED.value and job.annotated_key:
        try:
            image = rt.store.get(job.annotated_key)
        except PaperlaneError as exc:
            log.warning("stored annotated image of job %s unreadable (%s)", job.id, exc)
    return page_result(rt.store, job, source=page.source, page_no=page.page_no), image
