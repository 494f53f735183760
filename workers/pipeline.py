"""One micro-batch through the pipeline: preprocess -> engine -> post-process -> render + store.

The same code serves the Celery worker and the embedded ``paperlane run``. It writes successes
(objects, then rows) and returns every page's outcome; what to do with a failure (retry or give
up) is the caller's policy, kept apart from this single attempt.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

from models.engine import Engine, EngineOutput, EngineRequest, PreparedImage
from models.factory import build_engine
from paperlane.errors import EngineUnavailable, InputError, PaperlaneError, public_reason
from paperlane.schemas import JobStatus, PageResult, Stage, TaskSpec
from paperlane.settings import Settings
from storage import jobs as jobstore
from storage.db import Database
from storage.objects import ObjectStore, annotated_key, open_store, result_key
from storage.tables import JobRow
from workers.cpu_pool import CpuPool, Prepared
from workers.postprocess import build_result
from workers.render import annotate

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    """What a worker process keeps resident for its life: database, store, engine, CPU pool."""

    settings: Settings
    db: Database
    store: ObjectStore
    engine: Engine
    pool: CpuPool

    @classmethod
    def start(cls, settings: Settings, *, engine: Engine | None = None) -> Runtime:
        db = Database(settings.database_url, pool_size=settings.database.pool_size, echo=settings.database.echo)
        db.upgrade()
        store = open_store(settings)
        engine = engine or build_engine(settings.engine)
        engine.start()
        return cls(settings=settings, db=db, store=store, engine=engine, pool=CpuPool(settings))

    def close(self) -> None:
        self.pool.close()
        self.engine.close()
        self.db.dispose()


@dataclass
class PageOutcome:
    job: JobRow
    result: PageResult
    error: Exception | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None


def task_spec(job: JobRow) -> TaskSpec:
    return TaskSpec(task=job.task, **(job.task_options or {}))


def prefetch(rt: Runtime, jobs: Sequence[JobRow]) -> list[Future[Prepared]]:
    """Start preprocessing ``jobs`` in the CPU pool; the futures feed ``run_batch``."""
    spec = rt.engine.input_spec
    return [rt.pool.submit(job.original_key or "", spec) for job in jobs]


def run_batch(rt: Runtime, jobs: Sequence[JobRow], prepared: Sequence[Future[Prepared]] | None = None) -> list[PageOutcome]:
    """Process one micro-batch; one outcome per job, in order. Successes are already stored."""
    futures = list(prepared) if prepared is not None else prefetch(rt, jobs)
    outcomes: list[PageOutcome | None] = [None] * len(jobs)
    todo: list[tuple[int, PreparedImage, dict[str, float]]] = []
    for i, (job, fut) in enumerate(zip(jobs, futures)):
        timings = _known_timings(job)
        prep = _await_prepared(rt, job, fut)
        timings[Stage.PREPROCESS.value] = prep.seconds
        if prep.error is not None or prep.image is None:
            outcomes[i] = _failed(job, prep.error or PaperlaneError("preprocessing failed"), timings)
        else:
            todo.append((i, prep.image, timings))
    for i, outcome in _infer_and_store(rt, jobs, todo):
        outcomes[i] = outcome
    return [o for o in outcomes if o is not None]


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


def _infer_and_store(rt: Runtime, jobs: Sequence[JobRow],
                     todo: list[tuple[int, PreparedImage, dict[str, float]]]) -> list[tuple[int, PageOutcome]]:
    if not todo:
        return []
    requests = [EngineRequest(image=img, spec=task_spec(jobs[i])) for i, img, _ in todo]
    t0 = time.perf_counter()
    try:
        results: list[EngineOutput | PaperlaneError] = list(rt.engine.infer(requests))
    except EngineUnavailable as exc:
        results = [exc] * len(todo)
    share = (time.perf_counter() - t0) / len(todo)
    done = []
    for (i, image, timings), res in zip(todo, results):
        job = jobs[i]
        if isinstance(res, PaperlaneError):
            timings[Stage.INFERENCE.value] = share
            done.append((i, _failed(job, res, timings)))
            continue
        timings[Stage.INFERENCE.value] = res.seconds if res.seconds is not None else share
        done.append((i, _finish(rt, job, image, res, timings)))
    return done


def _finish(rt: Runtime, job: JobRow, image: PreparedImage, output: EngineOutput,
            timings: dict[str, float]) -> PageOutcome:
    t0 = time.perf_counter()
    result = build_result(job_id=job.id, source=job.source, page=job.page, spec=task_spec(job),
                          output=output, image=image, engine=rt.engine.info)
    t1 = time.perf_counter()
    timings[Stage.POSTPROCESS.value] = t1 - t0
    try:
        png_key = annotated_key(job.id)
        rt.store.put(png_key, annotate(image, result.lines), content_type="image/png")
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
    except Exception as exc:  # a bug must fail this page, not the batch; the traceback goes to the log
        log.exception("job %s failed while storing its result", job.id)
        return _failed(job, exc, timings)
    return PageOutcome(job=job, result=result, timings=timings)


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
