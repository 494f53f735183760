"""One page through the pipeline: preprocess -> engine (in a micro-batch) -> post-process -> store.

The same code serves the Celery worker and the embedded ``paperlane run``: each page in progress runs
``process_page`` on its own task slot; the CPU pool prepares it while earlier pages are in the engine, and the
``MicroBatcher`` gathers the slots' prepared pages into batches. This function is the middle of ONE attempt
(``workers.attempts.AttemptRunner`` claims the page before it and settles it after): it writes a success
(``_finish``: the result built and its objects stored on the CPU pool, then its rows) and returns every outcome;
what follows it is the retry policy's to say.
Whatever happens to a page, in the pool, the engine, post-processing or storing, becomes its failed outcome, and
the batcher's count of pages on their way is balanced on every path.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from paperlane.errors import INTERNAL_REASON, OutOfMemory, PaperlaneError, WorkerStopping, public_reason
from paperlane.formats import lookup
from paperlane.metrics import PAGE_FLAGS, PAGES_GRADED
from paperlane.models.engine import Capacity, Engine, EngineOutput, EngineRequest, Outcome
from paperlane.models.factory import build_engine
from paperlane.priority.lanes import LEVELS_PER_LANE, Lane
from paperlane.schemas import EngineInfo, JobStatus, PageResult, Quality, Stage, Task, TaskSpec
from paperlane.settings import Settings, StorageBackend, WorkerSettings
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database, utcnow
from paperlane.storage.objects import ObjectStore, open_store
from paperlane.storage.tables import JobRow
from paperlane.workers.drawing import drawn_by_worker
from paperlane.workers.answers import EngineAnswers
from paperlane.workers.batcher import MicroBatcher
from paperlane.workers.cpu_pool import CpuPool, Prepared
from paperlane.workers.originals import FOLDER_PREFIX as KEPT_PREFIX
from paperlane.workers.outputs_pool import OutputsPool, writer_of
from paperlane.workers.page_store import Finish
from paperlane.workers.preprocess import PreparedPage
from paperlane.workers.previews import SpooledPreview
from paperlane.workers.scratch import ScratchFolder

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    """What a worker process keeps resident for its life: database, store, engine, pools, batcher.

    The process that feeds the engine does only what needs the engine connection and the page's rows: preparing
    pages and storing their objects run on the CPU pool (``pool``), document outputs on their own processes
    (``outputs``)."""

    settings: Settings
    db: Database
    store: ObjectStore
    engine: Engine
    pool: CpuPool
    batcher: MicroBatcher
    outputs: OutputsPool
    slots: int  # pages in progress at once
    batch_slots: int  # of which batch pages may hold at most this many: the rest wait for interactive ones
    answers: EngineAnswers | None = None  # workers keep engine answers in Redis; `paperlane run` does not
    images_back: bool = True  # annotated images come back to this process (``paperlane run`` writes them out)
    results_back: bool = True  # results come back whole, lines and blocks too (``paperlane run`` writes them out)
    kept: ScratchFolder | None = None  # originals kept for this runtime's outputs (``workers.originals``)
    # The transaction that finishes a document claims its outputs for ``outputs`` (a worker's, whose AttemptRunner
    # writes them held: no claim of its own to make); ``paperlane run`` claims them when it writes them.
    claim_outputs: bool = False

    @classmethod
    def start(cls, settings: Settings, *, engine: Engine | None = None,
              answers: EngineAnswers | None = None, images_back: bool = True, results_back: bool = True,
              claim_outputs: bool = False) -> Runtime:
        """Open the database (migrated), the store and the CPU pool, and load ``engine`` (default: the one the
        settings name); ``answers``: where engine answers are kept for a retried page (workers only);
        ``images_back``: annotated images come back in each outcome, ``results_back``: results come back whole
        (``paperlane run`` writes both out; a worker needs neither: its results are stored)."""
        db = Database(settings.database_url, pool_size=settings.database.pool_size, echo=settings.database.echo)
        db.upgrade()
        store = open_store(settings)
        engine = engine or build_engine(settings.engine)
        engine.start()
        cfg, cap = settings.worker, engine.capacity
        plan = Slots.plan(cfg, cap)
        batcher = MicroBatcher(engine, max_size=plan.batch_size, max_wait=cfg.batch_wait,
                               urgent_below=LEVELS_PER_LANE, dispatchers=cap.batches_in_flight,
                               batch_share=cfg.batch_share)
        log.info("engine %s: batches of %d, %d in flight, %d page slots", engine.info.name, plan.batch_size,
                 cap.batches_in_flight, plan.total)
        # Originals read from a remote store are kept for the searchable PDFs this worker builds (workers.originals).
        keeps = cfg.write_outputs and any(lookup(fmt).reads_original for fmt in cfg.output_formats) and \
            settings.storage.backend is StorageBackend.S3
        kept = ScratchFolder(KEPT_PREFIX) if keeps else None
        folder = kept.path if kept is not None else None
        pool = CpuPool(settings, store=store, previews=drawn_by_worker(settings, files=images_back), kept=folder)
        return cls(settings=settings, db=db, store=store, engine=engine, pool=pool, batcher=batcher,
                   outputs=OutputsPool(settings, writer_of(settings, db, store, kept=folder), kept=folder),
                   slots=plan.total, batch_slots=plan.batch, answers=answers, images_back=images_back,
                   results_back=results_back, kept=kept, claim_outputs=claim_outputs)

    def close(self) -> None:
        stats = self.batcher.stats
        log.info("engine ran %d batches, %d pages, busy %.1fs", stats.batches, stats.pages, stats.busy_s)
        self.batcher.close()
        self.outputs.close()
        self.pool.close()
        self.engine.close()
        self.db.dispose()
        if self.kept is not None:
            self.kept.close()


@dataclass(frozen=True)
class Slots:
    """How many pages a runner works on at once, and how many of them may be batch pages."""

    batch_size: int  # pages per engine call
    total: int
    batch: int  # the rest stay free for interactive pages

    @classmethod
    def plan(cls, cfg: WorkerSettings, capacity: Capacity) -> Slots:
        """Enough slots for the pages in the engine plus as many again being fetched, prepared and stored around
        it (at least two batches: the engine never waits for the CPU), and a reserve kept free for interactive
        pages, so they start at once even behind a backlog (``worker.slots`` overrides the total)."""
        batch_size = cfg.batch_size or capacity.batch_size
        in_engine = batch_size * capacity.batches_in_flight
        reserve = max(batch_size, -(-in_engine // 4))
        total = cfg.slots or in_engine + max(2 * batch_size, in_engine) + reserve
        return cls(batch_size, total, max(1, total - reserve))


@dataclass
class PageOutcome:
    job: JobRow
    result: PageResult
    error: Exception | None = None
    timings: dict[str, float] = field(default_factory=dict)
    annotated: bytes | None = None  # the annotated image as stored (worker.annotated_format), on success
    # On success, whether ``result`` is whole: without ``Runtime.results_back`` its lines and blocks stay in the
    # stored JSON (rows and metering need only the rest), which comes back as ``stored_json`` for the document's
    # outputs to read instead of the store's copy.
    whole: bool = True
    stored_json: bytes | None = None
    outputs_due: list[str] = field(default_factory=list)  # documents whose outputs its success made due
    outputs_held: datetime | None = None  # claimed by the transaction that made them due, until then

    @property
    def ok(self) -> bool:
        return self.error is None


def task_spec(job: JobRow) -> TaskSpec:
    return TaskSpec(task=Task(job.task), **(job.task_options or {}))


def process_page(rt: Runtime, job: JobRow) -> PageOutcome:
    """One attempt at one page. Never raises for anything that goes wrong with the page: that becomes
    its failed outcome, classified where we can and "internal error" (traceback in the log) otherwise."""
    timings = _known_timings(job)
    try:
        return _through_pipeline(rt, job, timings)
    except Exception as exc:
        return _failed(job, _classified(job, exc, _stage_reached(timings)), timings)


def _through_pipeline(rt: Runtime, job: JobRow, timings: dict[str, float]) -> PageOutcome:
    spec = task_spec(job)
    urgent = job.lane == Lane.INTERACTIVE.value  # never queue behind the backlog's preprocessing
    rt.batcher.expect()
    pending: Future[tuple[Outcome, float]] | None = None
    prep: Prepared | None = None
    try:
        try:
            prep = _prepared(rt, job, urgent=urgent)
            timings[Stage.PREPROCESS.value] = prep.seconds
            ready = time.perf_counter()
            # A retried page may have been answered already (its worker died before storing the result).
            kept = rt.answers.get(job.id) if rt.answers is not None and job.attempts > 1 else None
            if prep.page is not None and kept is None:
                pending = rt.batcher.submit(EngineRequest(image=prep.page.image, spec=spec,
                                                          priority=job.message_priority, urgent=urgent),
                                            priority=job.message_priority)
        finally:
            # Batches wait for every page announced and not submitted: a page that will not come must be
            # taken back on every path, or each later batch waits its full batch_wait for it.
            if pending is None:
                rt.batcher.unexpect()
        return _answered(rt, job, spec, prep, pending, kept, ready, timings)
    finally:
        if prep is not None and prep.page is not None and isinstance(prep.page.preview, SpooledPreview):
            prep.page.preview.discard()  # drawn on or not, the attempt is over


def _answered(rt: Runtime, job: JobRow, spec: TaskSpec, prep: Prepared, pending: Future[tuple[Outcome, float]] | None,
              kept: EngineOutput | None, ready: float, timings: dict[str, float]) -> PageOutcome:
    """The rest of ``_through_pipeline`` once the page is prepared: its engine answer (or the one ``kept``), then
    its result and rows."""
    if prep.page is not None and kept is not None:
        log.info("job %s: the engine's answer from an earlier attempt is used", job.id)
        timings[Stage.INFERENCE.value] = kept.seconds or 0.0
        return _finish_or_fail(rt, job, spec, prep.page, kept, timings)
    if prep.page is None or pending is None:
        if prep.traceback:
            log.error("job %s: unexpected error while preprocessing\n%s", job.id, prep.traceback.rstrip())
        return _failed(job, prep.error or PaperlaneError("preprocessing failed", stage="preprocess"), timings)
    outcome, batch_s = pending.result()
    own = outcome.seconds if isinstance(outcome, EngineOutput) and outcome.seconds is not None else batch_s
    timings[Stage.INFERENCE.value] = own
    # Waiting for the engine (a batch ahead, the batch filling, pages before it) is queueing.
    waited = max(0.0, time.perf_counter() - ready - own)
    timings[Stage.QUEUE_WAIT.value] = timings.get(Stage.QUEUE_WAIT.value, 0.0) + waited
    if isinstance(outcome, EngineOutput):
        if rt.answers is not None:
            rt.answers.put(job.id, outcome)
        return _finish_or_fail(rt, job, spec, prep.page, outcome, timings)
    if not isinstance(outcome, Exception):  # an engine broke its contract: say what it gave, not a traceback
        log.error("job %s: the engine returned %s, not a result", job.id, type(outcome).__name__)
        outcome = PaperlaneError(INTERNAL_REASON, stage=Stage.INFERENCE.value)
    return _failed(job, _classified(job, outcome, Stage.INFERENCE.value), timings)


def _prepared(rt: Runtime, job: JobRow, *, urgent: bool) -> Prepared:
    # A page that kills its pool process (a crash, memory or time past the limits) fails alone, with a
    # reason (``paperlane.bounded``): the process is replaced and no other page is touched.
    try:
        return rt.pool.submit(job.original_key or "", rt.engine.input_spec, page=job.page, urgent=urgent).result()
    except CancelledError:  # the pool was shut down under the page: the worker is stopping
        return Prepared(None, WorkerStopping("the worker stopped before this page was prepared",
                                             stage=Stage.PREPROCESS.value), 0.0)


def _finish_or_fail(rt: Runtime, job: JobRow, spec: TaskSpec, page: PreparedPage, output: EngineOutput,
                    timings: dict[str, float]) -> PageOutcome:
    """``_finish``, or the page's failed outcome carrying the engine's usage report: its work was spent, and a
    page that fails for good is metered with it."""
    try:
        return _finish(rt, job, spec, page, output, timings)
    except Exception as exc:
        failed = _failed(job, _classified(job, exc, _stage_reached(timings)), timings)
        failed.result.usage = output.usage
        return failed


def _finish(rt: Runtime, job: JobRow, spec: TaskSpec, page: PreparedPage, output: EngineOutput,
            timings: dict[str, float]) -> PageOutcome:
    """The page's result built and its objects stored on the CPU pool (``page_store.finish_objects``), then its
    rows here (objects first: a row never points at an object that is not there). Raises what building the result,
    storing the objects, the store or the database raise."""
    t0 = time.perf_counter()
    urgent = job.lane == Lane.INTERACTIVE.value
    finish = Finish(job_id=job.id, source=job.source, page=job.page, spec=spec, output=output,
                    image=Finish.geometry(page.image), size=(page.width, page.height), engine=rt.engine.info,
                    layout=rt.settings.layout)
    try:
        done = rt.pool.finish(finish, page.preview, timings=dict(timings), urgent=urgent, image_back=rt.images_back,
                              result_back=rt.results_back).result()
    except CancelledError:  # the pool was shut down under the page: the worker is stopping
        raise WorkerStopping("the worker stopped before this page was stored", stage=Stage.STORE.value) from None
    stored, result = done.stored, done.result
    if stored.traceback:
        log.error("job %s: unexpected error while building or storing its result\n%s", job.id,
                  stored.traceback.rstrip())
    error = stored.error
    if error is None and (stored.json_key is None or result is None):
        error = PaperlaneError(INTERNAL_REASON, stage=Stage.STORE.value)
    if error is None or error.stage != Stage.POSTPROCESS.value:  # the result was built
        timings[Stage.POSTPROCESS.value] = done.seconds
    if error is not None:
        raise error
    assert result is not None and stored.json_key is not None
    # The JSON's store time covers rendering and the image upload; the row gets the full time, the trip included.
    result.timings = {**timings, Stage.STORE.value: stored.seconds}
    timings[Stage.STORE.value] = time.perf_counter() - t0 - done.seconds
    if result.quality is not None:
        count_grade(result.quality)
    claim = utcnow() + timedelta(seconds=rt.outputs.hold) if rt.claim_outputs else None
    finished = jobstore.finish_succeeded(rt.db, job, result, engine=_engine_name(result.engine or rt.engine.info),
                                         result_key=stored.json_key, annotated_key=stored.annotated_key,
                                         timings=timings, lines=done.lines, claim_until=claim)
    return PageOutcome(job=job, result=result, timings=timings, annotated=stored.image, outputs_due=finished,
                       outputs_held=claim if finished else None, whole=rt.results_back, stored_json=stored.json)


def count_grade(quality: Quality) -> None:
    """Count a page's grade in the ``paperlane_page_flags`` and ``paperlane_pages_graded`` metrics: here, where its
    rows are written (a pool process's metrics would be nobody's)."""
    for flag in quality.flags:
        PAGE_FLAGS.labels(flag.value).inc()
    PAGES_GRADED.labels(str(quality.needs_review).lower()).inc()


def _classified(job: JobRow, exc: Exception, stage: str) -> PaperlaneError:
    """What the page's row records for ``exc``: our errors as they are, running out of memory as a
    retryable error, anything else as "internal error", its traceback in the log."""
    if isinstance(exc, PaperlaneError):
        exc.stage = exc.stage or stage
        return exc
    if isinstance(exc, MemoryError):
        log.warning("job %s: out of memory in %s", job.id, stage)
        return OutOfMemory("not enough memory to process this page", stage=stage)
    log.error("job %s: unexpected error in %s", job.id, stage, exc_info=exc)
    return PaperlaneError(INTERNAL_REASON, stage=stage)


def _stage_reached(timings: dict[str, float]) -> str:
    """The stage a page was in when it failed: the first one without a time yet."""
    for stage in (Stage.PREPROCESS, Stage.INFERENCE, Stage.POSTPROCESS):
        if stage.value not in timings:
            return stage.value
    return Stage.STORE.value


def _engine_name(info: EngineInfo) -> str:
    """The job row's engine: the one that read the page (``rapidocr ... fallback for vllm`` for a fallback)."""
    fallback = f" fallback for {info.fallback_for}" if info.fallback_for else ""
    return f"{info.name} {info.version}{fallback}"[:64]


def _known_timings(job: JobRow) -> dict[str, float]:
    return {k: v for k, v in jobstore.job_timings(job).items()
            if k in (Stage.UPLOAD.value, Stage.QUEUE_WAIT.value)}


def _failed(job: JobRow, error: Exception, timings: dict[str, float]) -> PageOutcome:
    # Task(job.task), not task_spec(job): options that do not validate may be why the page failed.
    result = PageResult(job_id=job.id, source=job.source, page=job.page, status=JobStatus.FAILED,
                        error=public_reason(error), task=Task(job.task), timings=dict(timings))
    return PageOutcome(job=job, result=result, error=error, timings=timings)
