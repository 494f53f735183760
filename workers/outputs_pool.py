"""Document outputs built off the process that feeds the engine: ``OutputsPool``.

A finished document's outputs (its searchable PDF with a text layer, markdown, JSON, ALTO, ...) are the heaviest CPU
work after the engine, and need no engine connection. They are claimed in the worker's (or the run's) own process,
by the transaction that finished the document (a worker's: ``Runtime.claim_outputs``, then ``write_held``) or by one
statement (``write``: ``storage.outputs.claim``), recorded before done either way, and then built, stored and
recorded as written by a process of this pool, which keeps its own database and store clients
(``worker.output_processes``; 0: a thread of this process, for tests and tiny machines). Writing them twice writes
the same objects: harmless.

Failures, each a readable reason on that document: a try that raises is recorded by the process that made it
(``outputs.Writer``); one whose process died or ran past its limits (``worker.render_memory_bytes`` of memory,
``worker.page_timeout`` seconds of CPU) is recorded here, and the outputs are due again after the retry policy's
backoff, like any failed try. A try the pool never started (it was closed) keeps its claim until the claim lapses,
and the outputs sweep writes it then.

Documents waiting for the pool are bounded (``write`` waits while ``4 x processes`` are): a runner that finishes
documents faster than the pool writes them slows down, instead of queueing without end.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from paperlane import heap
from paperlane.bounded import BoundedPool, TaskFailed
from paperlane.errors import OverLimit
from paperlane.retry import RetryPolicy
from paperlane.settings import Settings
from paperlane.storage.db import Database
from paperlane.storage.objects import ObjectStore, open_store
from paperlane.storage.outputs import Claim
from paperlane.storage.results import Known
from paperlane.workers.originals import KeptFirst, KeptOriginals
from paperlane.workers.outputs import DocumentOutputs, Writer

log = logging.getLogger(__name__)

# What to do with written outputs beside storing them (``paperlane run``: its files into the out folder), run where
# they were written; a module-level function or a partial of one, as it may cross into a pool process.
Then = Callable[[ObjectStore, DocumentOutputs], None]

_writer: Writer | None = None  # a pool process's own


def output_processes(settings: Settings) -> int:
    """``worker.output_processes``, or unset: 1, or 0 (a thread) when the CPU pool runs in-process too, or when
    this worker leaves outputs to ``paperlane outputs`` (``worker.write_outputs`` false)."""
    cfg = settings.worker
    if not cfg.write_outputs:
        return 0
    if cfg.output_processes is not None:
        return cfg.output_processes
    return 0 if cfg.preprocess_processes == 0 else 1


def writer_of(settings: Settings, db: Database, store: ObjectStore, *, kept: Path | None = None) -> Writer:
    """The outputs writer the settings describe, on ``db`` and ``store``; ``kept``: it reads the originals the
    worker's preprocessing left in this folder before the store's (``workers.originals``)."""
    cfg = settings.worker
    source = KeptFirst(store, KeptOriginals(kept)) if kept is not None else store
    return Writer(db, source, RetryPolicy.of(cfg), hold=cfg.page_timeout, max_pixels=cfg.max_image_pixels,
                  formats=cfg.output_formats)


def _init_process(settings: Settings, kept: str | None) -> None:
    global _writer
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.nice(5)  # outputs wait; the pages on their way to the engine, and the worker itself, do not
    _writer = writer_of(settings, Database(settings.database_url, pool_size=2), open_store(settings),
                        kept=Path(kept) if kept else None)
    heap.after_start()


def _write_in_process(held: Claim, known: Known | None, then: Then | None) -> bool:
    assert _writer is not None, "outputs process not initialised"
    return _write(_writer, held, known, then)


def _write(writer: Writer, held: Claim, known: Known | None, then: Then | None) -> bool:
    """Write the outputs ``held`` claims, then ``then``; whether they were written. Never raises."""
    built = writer.write_held(held, known)
    if built is None:
        return False
    if then is not None:
        try:
            then(writer.store, built)
        except Exception as exc:  # the outputs are stored and recorded; only the caller's copy is missing
            log.warning("document %s: outputs written, but not copied out: %s", held.document_id, exc, exc_info=exc)
    return True


class OutputsPool:
    """Writes document outputs on processes of their own (see the module docstring). ``writer``: this process's,
    which claims the outputs and records a try whose process died."""

    def __init__(self, settings: Settings, writer: Writer, *, kept: Path | None = None) -> None:
        """``kept``: the folder of originals the worker's preprocessing leaves, which the pool's processes read
        before the store (``writer_of``; ``writer``, made with the same folder, writes on a thread instead)."""
        self._writer = writer
        cfg, processes = settings.worker, output_processes(settings)
        self._room = threading.BoundedSemaphore(4 * max(1, processes))
        self._pending: set[Future[bool]] = set()
        self._lock = threading.Lock()
        self._pool: BoundedPool | None = None
        self._threads: ThreadPoolExecutor | None = None
        if processes:
            self._pool = BoundedPool(processes, name="outputs", memory_bytes=cfg.render_memory_bytes,
                                     timeout=cfg.page_timeout, initializer=_init_process,
                                     initargs=(settings, str(kept) if kept is not None else None))
        else:
            self._threads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outputs")
        log.info("document outputs: %s", f"{processes} process(es)" if processes else "a thread of this process")

    def write(self, document_id: str, *, known: Known | None = None,
              then: Then | None = None) -> Future[bool]:
        """Claim the document's outputs if they are due and nobody holds them, and have them written (and
        ``then`` done with them); the future says whether they were (False: not due, held by another writer, or
        this try failed, recorded). ``known``: job id -> a result just stored for it. Waits while the pool has its
        fill of documents. Raises what the database raises while claiming."""
        held = self._writer.claim(document_id)
        if held is None:
            done: Future[bool] = Future()
            done.set_result(False)
            return done
        return self._submit(held, known, then)

    @property
    def hold(self) -> float:
        """Seconds a claim on a document's outputs holds them for this pool's writer."""
        return self._writer.hold

    def write_held(self, held: Claim, *, known: Known | None = None, then: Then | None = None) -> Future[bool]:
        """``write``, for outputs claimed already (``held``: by the transaction that finished the document)."""
        return self._submit(held, known, then)

    def write_due(self, *, limit: int = 10) -> int:
        """Claim due outputs nobody holds (their writer died, or a failed try's backoff is over) and have them
        written; how many were claimed. Raises what the database raises."""
        claims = self._writer.claim_due(limit=limit)
        for held in claims:
            self._submit(held, None, None)
        return len(claims)

    def _submit(self, held: Claim, known: Known | None, then: Then | None) -> Future[bool]:
        self._room.acquire()
        try:
            if self._pool is not None:
                future = self._pool.submit(_write_in_process, held, known, then)
            else:
                assert self._threads is not None
                future = self._threads.submit(_write, self._writer, held, known, then)
        except BaseException:
            self._room.release()
            raise
        outer: Future[bool] = Future()
        with self._lock:
            self._pending.add(outer)
        future.add_done_callback(lambda fut: self._settled(held, fut, outer))
        return outer

    def _settled(self, held: Claim, fut: Future[bool], outer: Future[bool]) -> None:
        self._room.release()
        written = False
        if fut.cancelled():  # the pool closed first: the claim lapses and the sweep writes them
            pass
        elif isinstance(exc := fut.exception(), TaskFailed):
            self._writer.record_failed(held, OverLimit(f"building this document's outputs crashed its process or "
                                                       f"ran past a worker's limits: {exc}", stage="outputs"))
        elif exc is not None:  # not ours to raise in a callback: the try is lost, the claim lapses
            log.error("document %s: outputs try lost", held.document_id, exc_info=exc)
        else:
            written = bool(fut.result())
        outer.set_result(written)
        with self._lock:
            self._pending.discard(outer)

    def drain(self) -> None:
        """Wait until every document handed to the pool has been written (or failed)."""
        while True:
            with self._lock:
                pending = list(self._pending)
            if not pending:
                return
            for future in pending:
                future.exception()

    def close(self) -> None:
        """Write what was handed over, then stop the processes."""
        self.drain()
        if self._pool is not None:
            self._pool.close()
        if self._threads is not None:
            self._threads.shutdown(wait=True)
