"""One page through the pipeline: preprocess -> engine (in a micro-batch) -> post-process -> store.

The same code serves the Celery worker and the embedded ``paperlane run``: each page in
progress runs ``process_page`` on its own task slot; the CPU pool prepares it while earlier pages
are in the engine, and the ``MicroBatcher`` gathers the slots' prepared pages into batches. This
function is ONE attempt: it writes a success (objects, then rows) and returns every outcome; the
retry policy around it lives in ``workers.attempts``.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

from paperlane.errors import InputError, PaperlaneError, public_reason
from paperlane.models.engine import Engine, EngineOutput, EngineRequest, PreparedImage
from paperlane.models.factory import build_engine
from paperlane.priority.lanes import LEVELS_PER_LANE, Lane
from paperlane.schemas import JobStatus, PageResult, Stage, Task, TaskSpec
from paperlane.settings import Settings
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database
from paperlane.storage.objects import ObjectStore, annotated_key, open_store, result_key
from paperlane.storage.tables import JobRow
from paperlane.workers.batcher import MicroBatcher
from paperlane.workers.cpu_pool import CpuPool, Prepared
from paperlane.workers.postprocess import build_result
from paperlane.workers.render import annotate

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    """What a worker process keeps resident for its life: database, store, engine, pool, batcher."""

    settings: Settings
    db: Database
    store: ObjectStore
    engine: Engine
    pool: CpuPool
    batcher: MicroBatcher
    slots: int  # pages in progress at once
    batch_slots: int  # of which batch pages may hold at most this many: the rest wait for interactive ones

    @classmethod
    def start(cls, settings: Settings, *, engine: Engine | None = None) -> Runtime:
        db = Database(settings.database_url, pool_size=settings.database.pool_size, echo=settings.database.echo)
        db.upgrade()
        store = open_store(settings)
        engine = engine or build_engine(settings.engine)
        engine.start()
        cfg, cap = settings.worker, engine.capacity
        batch_size = cfg.batch_size or cap.batch_size
        batcher = MicroBatcher(engine, max_size=batch_size, max_wait=cfg.batch_wait, urgent_below=LEVELS_PER_LANE,
                               dispatchers=cap.batches_in_flight)
        # Enough slots for the batches in the engine plus two more being fetched and prepared (the
        # engine never waits for the CPU), and one batch more kept free for interactive pages, so
        # they start at once even behind a backlog.
        reserve = batch_size
        slots = cfg.slots or batch_size * (cap.batches_in_flight + 2) + reserve
        log.info("engine %s: batches of %d, %d in flight, %d page slots", engine.info.name, batch_size,
                 cap.batches_in_flight, slots)
        return cls(settings=settings, db=db, store=store, engine=engine, pool=CpuPool(settings), batcher=batcher,
                   slots=slots, batch_slots=max(1, slots - reserve))

    def close(self) -> None:
        stats = self.batcher.stats
        log.info("engine ran %d batches, %d pages, busy %.1fs", stats.batches, stats.pages, stats.busy_s)
        self.batcher.close()
        self.pool.close()
        self.engine.close()
        self.db.dispose()


@dataclass
class PageOutcome:
    job: JobRow
    result: PageResult
    error: Exception | None = None
    timings: dict[str, float] = field(default_factory=dict)
    annotated: bytes | None = None  # the annotated PNG as stored, on success

    @property
    def ok(self) -> bool:
        return self.error is None


def task_spec(job: JobRow) -> TaskSpec:
    return TaskSpec(task=Task(job.task), **(job.task_options or {}))


def process_page(rt: Runtime, job: JobRow) -> PageOutcome:
    """One attempt at one page. Never raises for the page's own failure."""
    timings = _known_timings(job)
    rt.batcher.expect()
    urgent = job.lane == Lane.INTERACTIVE.value  # never queue behind the backlog's preprocessing
    prep = _await_prepared(rt, job, rt.pool.submit(job.original_key or "", rt.engine.input_spec, urgent=urgent))
    timings[Stage.PREPROCESS.value] = prep.seconds
    if prep.image is None:
        rt.batcher.unexpect()
        return _failed(job, prep.error or PaperlaneError("preprocessing failed"), timings)
    ready = time.perf_counter()
    try:
        pending = rt.batcher.submit(EngineRequest(image=prep.image, spec=task_spec(job), priority=job.priority),
                                   priority=job.priority)
    except PaperlaneError as exc:  # the worker is shutting down: the page is retried elsewhere
        return _failed(job, exc, timings)
    outcome, batch_s = pending.result()
    own = outcome.seconds if isinstance(outcome, EngineOutput) and outcome.seconds is not None else batch_s
    timings[Stage.INFERENCE.value] = own
    # Waiting for the engine (a batch ahead, the batch filling, pages before it) is queueing.
    waited = max(0.0, time.perf_counter() - ready - own)
    timings[Stage.QUEUE_WAIT.value] = timings.get(Stage.QUEUE_WAIT.value, 0.0) + waited
    if not isinstance(outcome, EngineOutput):
        return _failed(job, outcome, timings)
    return _finish(rt, job, prep.image, outcome, timings)


def _await_prepared(rt: Runtime, job: JobRow, fut: Future[Prepared]) -> Prepared:
    # A pool process that dies (a decoder crash) breaks every pending future of its pool: each
    # page gets one more try on a fresh pool, and the page that crashes it twice is failed.
    for attempt in (1, 2):
        try:
            return fut.result()
        except BrokenProcessPool:
            rt.pool.restart_if_broken()
            if attempt == 1:
                fut = rt.pool.submit(job.original_key or "", rt.engine.input_spec)
    log.error("job %s crashed the preprocessing process twice", job.id)
    return Prepared(None, InputError("this page crashes the image decoder", stage="preprocess"), 0.0)


def _finish(rt: Runtime, job: JobRow, image: PreparedImage, output: EngineOutput,
            timings: dict[str, float]) -> PageOutcome:
    t0 = time.perf_counter()
    result = build_result(job_id=job.id, source=job.source, page=job.page, spec=task_spec(job),
                          output=output, image=image, engine=rt.engine.info)
    t1 = time.perf_counter()
    timings[Stage.POSTPROCESS.value] = t1 - t0
    try:
        png_key = annotated_key(job.id)
        png = annotate(image, result.lines)
        rt.store.put(png_key, png, content_type="image/png")
        # The JSON's store time covers rendering and the image upload; the row gets the full time.
        timings[Stage.STORE.value] = time.perf_counter() - t1
        result.timings = dict(timings)
        json_key = result_key(job.id)
        rt.store.put(json_key, result_json(result), content_type="application/json")
        timings[Stage.STORE.value] = time.perf_counter() - t1
        jobstore.finish_succeeded(rt.db, job, result, engine=_engine_name(rt), result_key=json_key,
                                  annotated_key=png_key, timings=timings)
    except PaperlaneError as exc:
        exc.stage = exc.stage or Stage.STORE.value
        return _failed(job, exc, timings)
    except Exception as exc:  # a bug must fail this page, not the worker; the traceback goes to the log
        log.exception("job %s failed while storing its result", job.id)
        return _failed(job, exc, timings)
    return PageOutcome(job=job, result=result, timings=timings, annotated=png)


def _engine_name(rt: Runtime) -> str:
    return f"{rt.engine.info.name} {rt.engine.info.version}"[:64]


def result_json(result: PageResult) -> bytes:
    return json.dumps(result.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":")).encode()


def _known_timings(job: JobRow) -> dict[str, float]:
    return {k: v for k, v in jobstore.job_timings(job).items()
            if k in (Stage.UPLOAD.value, Stage.QUEUE_WAIT.value)}


def _failed(job: JobRow, error: Exception, timings: dict[str, float]) -> PageOutcome:
    result = PageResult(job_id=job.id, source=job.source, page=job.page, status=JobStatus.FAILED,
                        error=public_reason(error), task=task_spec(job).task, timings=dict(timings))
    return PageOutcome(job=job, result=result, error=error, timings=timings)
