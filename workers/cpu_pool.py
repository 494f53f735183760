"""The CPU preprocessing pool: a process pool that fetches originals and prepares pages.

Each pool process builds its own object-store client once (initializer) and receives only object
keys and page numbers, never image bytes: the parent process never sends an original through the
pool's pipes. A PDF is the exception to fetching by key: the worker downloads it once into a local
folder that the pool's processes open it from, and each keeps it open for its next pages
(``workers.doccache``), so a PDF costs one download per worker and one parse per pool process, not
one of each per page. By default the pool has
as many processes as this process may use CPUs, less one for the worker itself (``workers.cpus``);
``worker.preprocess_processes`` sets another number, and 0 runs the work on a thread in the calling
process (tests, tiny machines).

Whatever goes wrong with one page comes back as that page's ``Prepared`` error, never as an
exception: a third-party one might not survive the trip back between processes, and a pool that
cannot unpickle a result is a broken pool.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import multiprocessing
import os
import time
import traceback
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from paperlane.errors import INTERNAL_REASON, OutOfMemory, PaperlaneError
from paperlane.models.engine import InputSpec
from paperlane.settings import Settings
from paperlane.storage.objects import ObjectStore, open_store
from paperlane.workers.cpus import WORKER_OWN_CPUS, available_cpus, pool_processes
from paperlane.workers.doccache import OpenDocuments, Spool, spooled_kind
from paperlane.workers.preprocess import Limits, PreparedPage, prepare_page

log = logging.getLogger(__name__)

_store: ObjectStore | None = None
_documents: OpenDocuments | None = None


@dataclass
class Prepared:
    """A preprocessing outcome: the page or the error, and the seconds it took.

    ``traceback``: for an error nobody anticipated (a bug), its traceback as text, for the worker's log.
    """

    page: PreparedPage | None
    error: PaperlaneError | None
    seconds: float
    traceback: str | None = None


def _init_process(settings: Settings) -> None:
    global _store, _documents
    # One ONNX/OpenCV thread per pool process: the pool itself is the parallelism.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Backlog preprocessing yields the CPU to the worker process, where interactive pages are
    # prepared, stored and acked: throughput is the same, latency under load much better.
    os.nice(5)
    import cv2

    cv2.setNumThreads(1)
    _keep_freed_memory()
    _store = open_store(settings)
    _documents = OpenDocuments(budget=settings.worker.open_document_bytes)


# glibc's mallopt() parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def _keep_freed_memory() -> None:
    """Keep a page's freed buffers for the next page instead of handing them back to the kernel.

    By default glibc gives a freed multi-megabyte buffer (mmap) or the free top of its heap (trim)
    back to the kernel, and the next page's buffers fault in again 4 kB at a time: 1,400 page faults
    and 3.5 ms of CPU per A4 page in a pool process, an eighth of its work. Buffers below 32 MB now
    come from the heap, and up to 64 MB of it stays free for reuse. Other C libraries: left alone.
    """
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):
        return
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)
    mallopt(_M_TRIM_THRESHOLD, 64 << 20)


def _prepare_key(key: str, page_number: int, spec: InputSpec, limits: Limits, preview_side: int,
                 local: str | None = None, waited: float = 0.0, store: ObjectStore | None = None,
                 documents: OpenDocuments | None = None) -> Prepared:
    """Prepare page ``page_number`` of the original ``key``: from its local copy ``local`` (a PDF the
    worker spooled) when there is one, else from the store. ``waited``: seconds the worker spent
    spooling it for this page, counted in the page's preprocessing time."""
    t0 = time.perf_counter() - waited
    try:
        store, documents = store or _store, documents or _documents
        assert store is not None and documents is not None, "pool process not initialised"
        if local is not None and os.path.exists(local):
            page = documents.prepare(key, Path(local), spec, limits, page=page_number, preview_side=preview_side)
        else:
            page = prepare_page(store.get(key), spec, limits, page=page_number, preview_side=preview_side)
        return Prepared(page, None, time.perf_counter() - t0)
    except PaperlaneError as exc:
        return Prepared(None, exc, time.perf_counter() - t0)
    except MemoryError:  # outside the decoder (which says so itself): fetching, copying
        return Prepared(None, OutOfMemory("not enough memory to prepare this page", stage="preprocess"),
                        time.perf_counter() - t0)
    except Exception:  # a bug: this page fails with a short reason and the worker logs the traceback
        return Prepared(None, PaperlaneError(INTERNAL_REASON, stage="preprocess"), time.perf_counter() - t0,
                        traceback.format_exc())


class CpuPool:
    """Preprocessing for the worker: a process pool for the stream of pages, plus a small thread
    lane in this process for urgent (interactive) pages, so they never queue behind the backlog's
    preprocessing. OpenCV releases the GIL while it decodes and resizes."""

    def __init__(self, settings: Settings, *, store: ObjectStore) -> None:
        """``store``: the worker process's own store, shared by the urgent lane (one client per process)."""
        self._limits = Limits(max_pixels=settings.worker.max_image_pixels,
                              max_bytes=settings.worker.max_input_bytes)
        self._preview_side = settings.worker.annotated_max_side
        self._settings = settings
        self._store = store
        cfg = settings.worker
        self._spool = (Spool(store, budget=cfg.document_cache_bytes, max_bytes=cfg.max_input_bytes)
                       if cfg.document_cache_bytes else None)
        self._documents = OpenDocuments(budget=cfg.open_document_bytes)  # the urgent lane's, and in-process pool's
        self._urgent = ThreadPoolExecutor(max_workers=2, thread_name_prefix="preprocess-urgent")
        setting, cpus = settings.worker.preprocess_processes, available_cpus()
        self._processes = pool_processes(setting, cpus)
        log.info("preprocessing pool: %d processes (%s)", self._processes, "worker.preprocess_processes"
                 if setting is not None else f"{cpus:g} CPUs usable, less {WORKER_OWN_CPUS} for the worker itself")
        self._executor = self._new_executor()

    def _new_executor(self) -> Executor:
        n = self._processes
        if n == 0:
            return ThreadPoolExecutor(max_workers=1, thread_name_prefix="preprocess")
        executor = ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn"),
                                       initializer=_init_process, initargs=(self._settings,))
        # Start every process now (spawning and importing takes a second or two each), not on the
        # first pages: a worker is warm before it takes work.
        for fut in [executor.submit(time.sleep, 0.3) for _ in range(n)]:
            fut.result()
        return executor

    def restart_if_broken(self) -> None:
        """Replace the pool with a fresh one if a process of it died (a submit then fails)."""
        try:
            self._executor.submit(int).result()
        except BrokenProcessPool:
            log.warning("preprocessing pool broken; starting a new one")
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = self._new_executor()

    def submit(self, key: str, spec: InputSpec, *, page: int = 1, urgent: bool = False) -> Future[Prepared]:
        """Fetch the original ``key`` and prepare its page ``page`` (from 1: a PDF's page, a TIFF's frame)
        for ``spec``: in the pool, or at once in-process when ``urgent``. A PDF is fetched here, once for
        all its pages (the first page of one waits for its download), and read from the local copy.

        The future's result is a ``Prepared``, whatever happened to the page (a page the original does
        not have: an InputError); the future itself fails only when the pool does (``BrokenProcessPool``:
        a process died) or is shut down.
        """
        t0 = time.perf_counter()
        spool = self._spool if self._spool is not None and spooled_kind(key) else None
        try:
            local = spool.acquire(key) if spool is not None else None
            args = (key, page, spec, self._limits, self._preview_side, local and str(local), time.perf_counter() - t0)
            if urgent or isinstance(self._executor, ThreadPoolExecutor):
                executor = self._urgent if urgent else self._executor
                future = executor.submit(_prepare_key, *args, self._store, self._documents)
            else:
                future = self._executor.submit(_prepare_key, *args)
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

    @property
    def spool(self) -> Spool | None:
        """The worker's local copies of PDFs (None when ``worker.document_cache_bytes`` is 0)."""
        return self._spool

    def close(self) -> None:
        self._urgent.shutdown(wait=True, cancel_futures=True)
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._documents.close()
        if self._spool is not None:
            self._spool.close()
