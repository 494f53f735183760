"""The CPU preprocessing pool: processes that fetch originals and prepare pages, each page bounded.

Each pool process builds its own object-store client once (initializer) and receives only object
keys and page numbers, never image bytes: the parent process never sends an original through the
pool's pipes. PDFs and TIFFs are read as ``workers.doccache`` decides: a large PDF by byte range
(each page reads its own objects), a smaller one or a TIFF from a copy the worker downloads once
into a local folder; each process keeps a PDF open for its next pages, so a page costs its page,
not its document. By default the pool has
as many processes as this process may use CPUs, less one for the worker itself (``workers.cpus``);
``worker.preprocess_processes`` sets another number, and 0 runs the work on a thread in the calling
process (tests, tiny machines: no limits then).

A page is prepared under limits (``paperlane.bounded``): ``worker.render_memory_bytes`` of memory and
``worker.render_timeout`` seconds of CPU (three times that in all), in a process that may die without
taking the worker or any other page with it. A page past a limit, or one that crashes its process,
fails (``OverLimit``, a reason that says which); its process is replaced. Interactive pages have processes of their own
(``worker.urgent_processes``), warm and not niced, so they never queue behind the backlog.

Whatever goes wrong with one page comes back as that page's ``Prepared`` error, never as an
exception: a third-party one might not survive the trip back between processes.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np

from paperlane import heap
from paperlane.bounded import BoundedPool, ProcessDied, TaskFailed, TaskTimedOut
from paperlane.errors import INTERNAL_REASON, OutOfMemory, OverLimit, PaperlaneError, StorageUnavailable
from paperlane.models.engine import InputSpec
from paperlane.settings import ImageFormat, Settings
from paperlane.storage.objects import ObjectStore, open_store
from paperlane.workers.cpus import WORKER_OWN_CPUS, available_cpus, pool_processes
from paperlane.workers.doccache import OpenDocuments, Source, Spool, read_whole, spooled_kind
from paperlane.workers.input_limits import Limits
from paperlane.workers.page_store import Finish, Finished, Stored, finish_objects
from paperlane.workers.preprocess import PreparedPage, prepare_page
from paperlane.workers.originals import KeptOriginals
from paperlane.workers.previews import FOLDER_PREFIX, SpooledPreview
from paperlane.workers.scratch import ScratchFolder

log = logging.getLogger(__name__)

T = TypeVar("T")

_store: ObjectStore | None = None
_documents: OpenDocuments | None = None
_previews: Path | None = None  # where this process leaves the previews it cuts (``workers.previews``)
_spool_warned = False
_memory_limit = 0  # this process's memory limit for one page (bytes; 0: none)
_kept: KeptOriginals | None = None  # where this process leaves the originals it reads (``workers.originals``)


@dataclass
class Prepared:
    """A preprocessing outcome: the page or the error, and the seconds it took.

    ``traceback``: for an error nobody anticipated (a bug), its traceback as text, for the worker's log.
    """

    page: PreparedPage | None
    error: PaperlaneError | None
    seconds: float
    traceback: str | None = None


def _init_process(settings: Settings, niced: bool, previews: str, kept: str | None = None) -> None:
    global _store, _documents, _memory_limit, _previews, _kept
    # One ONNX/OpenCV thread per pool process: the pool itself is the parallelism.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if niced:
        # Backlog preprocessing yields the CPU to the worker process and to the processes preparing
        # interactive pages: throughput is the same, latency under load much better.
        os.nice(5)
    _memory_limit = settings.worker.render_memory_bytes
    _previews = Path(previews)
    _kept = KeptOriginals(Path(kept)) if kept else None
    import cv2

    cv2.setNumThreads(1)
    _store = open_store(settings)
    _documents = OpenDocuments(budget=settings.worker.open_document_bytes)
    atexit.register(_documents.close)  # before PDFium's own exit hook, which warns of documents left open
    heap.after_start()


def _prepare_key(key: str, page_number: int, spec: InputSpec, limits: Limits, preview_side: int,
                 source: Source = Source(), waited: float = 0.0, store: ObjectStore | None = None,
                 documents: OpenDocuments | None = None, kept: KeptOriginals | None = None) -> Prepared:
    """Prepare page ``page_number`` of the original ``key``, read as ``source`` says (``workers.doccache``):
    from its local copy, by byte range from the store, or whole from the store. ``waited``: seconds the
    worker spent looking it up or spooling it for this page, counted in the page's preprocessing time."""
    t0 = time.perf_counter() - waited
    try:
        store, documents = store or _store, documents or _documents
        assert store is not None and documents is not None, "pool process not initialised"
        local = source.path
        if local is not None and local.suffix == ".pdf" and local.exists():
            page = documents.prepare(key, local, spec, limits, page=page_number, preview_side=preview_side)
        elif local is not None and local.exists():
            page = prepare_page(local.read_bytes(), spec, limits, page=page_number, preview_side=preview_side)
        elif source.ranged:
            page = documents.prepare_ranged(key, store, source.size, spec, limits, page=page_number,
                                            preview_side=preview_side)
        else:
            data = read_whole(store, key, limits.max_bytes)
            if (kept := kept or _kept) is not None:
                kept.keep(key, data)
            page = prepare_page(data, spec, limits, page=page_number, preview_side=preview_side)
        if _previews is not None and isinstance(page.preview, np.ndarray):
            page.preview = _spooled(page.preview, _previews)
        return Prepared(page, None, time.perf_counter() - t0)
    except OutOfMemory as exc:
        # Under this process's own memory limit running out is the page's doing, not the machine's.
        error = _over_memory() if _memory_limit else exc
        return Prepared(None, error, time.perf_counter() - t0)
    except PaperlaneError as exc:
        return Prepared(None, exc, time.perf_counter() - t0)
    except MemoryError:  # outside the decoder (which says so itself): fetching, copying
        return Prepared(None, _over_memory() if _memory_limit else
                        OutOfMemory("not enough memory to prepare this page", stage="preprocess"),
                        time.perf_counter() - t0)
    except Exception:  # a bug: this page fails with a short reason and the worker logs the traceback
        return Prepared(None, PaperlaneError(INTERNAL_REASON, stage="preprocess"), time.perf_counter() - t0,
                        traceback.format_exc())


def _spooled(preview: np.ndarray, folder: Path) -> np.ndarray | SpooledPreview:
    global _spool_warned
    try:
        return SpooledPreview.write(folder, preview)
    except OSError as exc:  # the folder full or gone: the preview goes through the pipe as before
        if not _spool_warned:  # once a process, not once a page
            log.warning("preview not written to %s (%s): previews go through the pool's pipes", folder, exc)
            _spool_warned = True
        return preview


def _finish_in_process(finish: Finish, preview: np.ndarray | SpooledPreview | None, fmt: ImageFormat,
                       timings: dict[str, float], image_back: bool, result_back: bool) -> Finished:
    """``page_store.finish_objects`` with this pool process's store client, the preview read from its file."""
    assert _store is not None, "pool process not initialised"
    if isinstance(preview, SpooledPreview):
        try:
            preview = preview.load()
        except OSError as exc:  # removed under it (the temp folder cleaned): prepared again on the next attempt
            return Finished(Stored(None, error=StorageUnavailable(f"the page's preview is gone ({exc})",
                                                                  stage="store")))
    return finish_objects(_store, finish, preview, fmt=fmt, timings=timings, image_back=image_back,
                          result_back=result_back)


def _over_memory() -> OverLimit:
    return OverLimit(f"preparing this page needs more memory than a worker gives one page "
                     f"({_memory_limit / 2**20:.0f} MiB)", stage="preprocess")


def _failed_in_process(exc: BaseException, settings: Settings, *, verb: str = "prepare",
                       stage: str = "preprocess") -> PaperlaneError:
    """What a page's row says when the process set to ``verb`` it (prepare it; store its objects, drawing its
    annotated image) was killed or died (``paperlane.bounded``)."""
    cfg, doing = settings.worker, f"{verb[:-1]}ing"
    if isinstance(exc, TaskTimedOut):
        return OverLimit(f"{doing} this page took longer than a worker gives one page: it {exc}", stage=stage)
    if isinstance(exc, ProcessDied) and exc.exitcode == -9:  # not ours: the kernel's OOM killer
        return OutOfMemory(f"not enough memory to {verb} this page (its process was killed)", stage=stage)
    return OverLimit(f"{doing} this page crashed its process or needed more memory than a worker gives one page "
                     f"({cfg.render_memory_bytes / 2**20:.0f} MiB); {exc}", stage=stage)


def _prepare_failure(settings: Settings, exc: TaskFailed, seconds: float) -> Prepared:
    return Prepared(None, _failed_in_process(exc, settings), seconds)


def _stored_failure(settings: Settings, exc: TaskFailed, seconds: float) -> Stored:
    return Stored(None, seconds=seconds, error=_failed_in_process(exc, settings, verb="store", stage="store"))


def _finished_failure(settings: Settings, exc: TaskFailed, seconds: float) -> Finished:
    return Finished(_stored_failure(settings, exc, seconds))


class CpuPool:
    """Preprocessing for the worker: bounded processes for the stream of pages, plus processes of their
    own for urgent (interactive) pages, so they never queue behind the backlog's preprocessing."""

    def __init__(self, settings: Settings, *, store: ObjectStore, previews: bool = True,
                 kept: Path | None = None) -> None:
        """``store``: the worker process's own store (spooling PDFs; pages prepared in-process); ``previews``: cut
        each page's preview, on which its annotated image is drawn when it finishes (``previews.drawn_by_worker``);
        ``kept``: leave each original read whole from the store in this folder (``workers.originals``).
        """
        self._kept = KeptOriginals(kept) if kept is not None else None
        self._limits = Limits(max_pixels=settings.worker.max_image_pixels,
                              max_bytes=settings.worker.max_input_bytes)
        self._preview_side = settings.worker.annotated_max_side if previews else 0
        self._settings = settings
        self._store = store
        cfg = settings.worker
        self._spool = (Spool(store, budget=cfg.document_cache_bytes, max_bytes=cfg.max_input_bytes,
                             ranged_above=cfg.ranged_pdf_bytes) if cfg.document_cache_bytes else None)
        self._documents = OpenDocuments(budget=cfg.open_document_bytes)  # for pages prepared in-process
        setting, cpus = settings.worker.preprocess_processes, available_cpus()
        self._processes = pool_processes(setting, cpus)
        log.info("preprocessing pool: %d processes (%s), %d for interactive pages", self._processes,
                 "worker.preprocess_processes" if setting is not None
                 else f"{cpus:g} CPUs usable, less {WORKER_OWN_CPUS} for the worker itself",
                 cfg.urgent_processes if self._processes else 0)
        self._threads: tuple[ThreadPoolExecutor, ThreadPoolExecutor] | None = None  # batch, urgent
        self._previews: ScratchFolder | None = None  # the pool processes' previews (``workers.previews``)
        self._pool: BoundedPool | None = None
        self._urgent: BoundedPool | None = None
        if self._processes == 0:
            self._threads = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="preprocess"),
                             ThreadPoolExecutor(max_workers=2, thread_name_prefix="preprocess-urgent"))
        else:
            self._previews = ScratchFolder(FOLDER_PREFIX)
            folder = str(self._previews.path)
            bounds = partial(BoundedPool, memory_bytes=cfg.render_memory_bytes, timeout=cfg.render_timeout,
                             initializer=_init_process)
            kept_in = str(kept) if kept is not None else None
            self._pool = bounds(self._processes, name="preprocess", initargs=(settings, True, folder, kept_in))
            self._urgent = bounds(cfg.urgent_processes, name="preprocess-urgent",
                                  initargs=(settings, False, folder, kept_in))

    def submit(self, key: str, spec: InputSpec, *, page: int = 1, urgent: bool = False) -> Future[Prepared]:
        """Fetch the original ``key`` and prepare its page ``page`` (from 1: a PDF's page, a TIFF's frame)
        for ``spec``: in the pool, or in the processes for interactive pages when ``urgent``. A PDF is
        looked up here, once for all its pages (the first page of one waits for its download, if it is
        downloaded), and read from the local copy or by byte range (``workers.doccache``).

        The future's result is a ``Prepared``, whatever happened to the page (a page the original does
        not have: an InputError; one past the memory or time limit, or that crashed its process:
        OverLimit); the future itself fails only when the pool is closed under it (cancelled).
        """
        t0 = time.perf_counter()
        spool = self._spool if self._spool is not None and spooled_kind(key) else None
        try:
            source = spool.acquire(key) if spool is not None else Source()
            args = (key, page, spec, self._limits, self._preview_side, source, time.perf_counter() - t0)
            if self._threads is not None:
                future = self._threads[1 if urgent else 0].submit(_prepare_key, *args, self._store, self._documents,
                                                                  self._kept)
            else:
                bounded = self._urgent if urgent else self._pool
                assert bounded is not None
                future = _mapped(bounded.submit(_prepare_key, *args), partial(_prepare_failure, self._settings), t0)
        except PaperlaneError as exc:  # the store, while spooling
            if spool is not None:
                spool.release(key)
            done: Future[Prepared] = Future()
            done.set_result(Prepared(None, exc, time.perf_counter() - t0))
            return done
        except BaseException:
            if spool is not None:
                spool.release(key)
            raise
        if spool is not None:
            future.add_done_callback(lambda _: spool.release(key))
        return future

    def finish(self, finish: Finish, preview: np.ndarray | SpooledPreview | None, *, timings: dict[str, float],
               urgent: bool = False, image_back: bool = False, result_back: bool = False) -> Future[Finished]:
        """Build a page's result from the engine's output and store its objects (``page_store.finish_objects``)
        on the pool, or the processes for interactive pages when ``urgent``: the process feeding the engine
        neither post-processes, draws nor serialises. The future's result is a ``Finished``, whatever happened
        (a page whose process died: an OverLimit); it fails only when the pool is closed under it (cancelled)."""
        fmt = self._settings.worker.annotated_format
        if self._threads is not None:
            assert not isinstance(preview, SpooledPreview), "pages prepared on threads keep their previews"
            return self._threads[1 if urgent else 0].submit(finish_objects, self._store, finish, preview, fmt=fmt,
                                                            timings=timings, image_back=image_back,
                                                            result_back=result_back)
        bounded = self._urgent if urgent else self._pool
        assert bounded is not None
        # First: a page finished frees its slot, and its objects wait behind no page still to be prepared.
        return _mapped(bounded.submit(_finish_in_process, finish, preview, fmt, timings, image_back, result_back,
                                      first=True), partial(_finished_failure, self._settings), time.perf_counter())

    @property
    def replaced(self) -> int:
        """Processes replaced after a page killed them or ran past its time (since the pool started)."""
        return sum(p.replaced for p in (self._pool, self._urgent) if p is not None)

    @property
    def spool(self) -> Spool | None:
        """The worker's local copies of PDFs and TIFFs (None when ``worker.document_cache_bytes`` is 0)."""
        return self._spool

    def close(self) -> None:
        for pool in (self._urgent, self._pool):
            if pool is not None:
                pool.close()
        for threads in self._threads or ():
            threads.shutdown(wait=True, cancel_futures=True)
        self._documents.close()
        if self._spool is not None:
            self._spool.close()
        if self._previews is not None:
            self._previews.close()


def _mapped(inner: Future[T], failure: Callable[[TaskFailed, float], T], t0: float) -> Future[T]:
    """A future of ``inner``'s result, or of ``failure``'s (the exception, the seconds since ``t0``) when its
    process was killed or died."""
    outer: Future[T] = Future()

    def done(fut: Future[T]) -> None:
        if fut.cancelled():
            outer.cancel()
            outer.set_running_or_notify_cancel()
            return
        exc = fut.exception()
        if isinstance(exc, TaskFailed):
            outer.set_result(failure(exc, time.perf_counter() - t0))
        elif exc is not None:
            outer.set_exception(exc)
        else:
            outer.set_result(fut.result())

    inner.add_done_callback(done)
    return outer
