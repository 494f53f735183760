"""Archive formats built away from the API's interpreter (issue 25).

Building a document's ALTO, hOCR or METS parses every page's result and writes XML: half a second of CPU for 200
pages. Done in the API process it held the interpreter, and other tenants' reads waited on the event loop behind it.
Here ``api.build_processes`` processes of their own do it, niced (``_NICE``) so that on a busy host the API's reads
win the CPU. Each opens its own database engine and object store from the settings once, reads the document's pages
and their results itself, builds the file (``storage.results``: ``built_document``, ``built_page``), keeps it in the
store when asked, and sends back only the bytes: the API process sends an id and a few names, and parses nothing.
The same processes draw a page's annotated image when it is first asked for and the worker did not draw it
(``DrawTask``, ``workers.drawing``): that reads and decodes the page's original, so it is bounded as builds are.

The processes start with the first build (an API that never builds pays nothing) and are held to
``api.build_timeout`` seconds of CPU and ``api.build_memory_bytes`` of memory per build (``paperlane.bounded``): a
build past them, or one whose process dies, answers 503 ``build_failed`` with the reason, and its process is
replaced; so does a build for which no process could start. A build still waiting for a process after ``_WAITS``
times its limit answers 503 ``build_busy``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from paperlane.bounded import WALL_FACTOR, BoundedPool, TaskFailed
from paperlane.errors import PaperlaneError
from paperlane.formats import FORMATS, media_type
from paperlane.producer.api.errors import ApiError
from paperlane.schemas import OutputFormat, PageResult
from paperlane.settings import Settings
from paperlane.storage import status_reads
from paperlane.storage.db import Database
from paperlane.storage.objects import ObjectStore, open_store
from paperlane.storage.results import built_document, built_page, page_result
from paperlane.storage.tables import JobRow

log = logging.getLogger(__name__)

_NICE = 10  # below the API process (nice 0): a build waits for the CPU a read needs
_WAITS = WALL_FACTOR + 1  # a request waits for its build this many times api.build_timeout, queueing included
PAGE_HREF = "/v1/pages/{page_id}?format={format}"  # where a METS built here lists its pages' files: this API

_db: Database | None = None
_store: ObjectStore | None = None
_settings: Settings | None = None

# What draws a page's annotated image on request (``workers.drawing.drawn_on_request``, handed down by the CLI:
# the API does not import the workers), from the store, the page's job and its result under the settings.
Draw = Callable[[ObjectStore, JobRow, PageResult, Settings], bytes]


@dataclass(frozen=True)
class BuildTask:
    """One file to build: the document ``document_id`` in ``fmt`` (``page``: the page of a page-only format), or,
    with ``page_id``, that page alone; ``keep``: the key to keep the bytes under, when they are kept."""

    document_id: str
    fmt: OutputFormat
    page: int | None = None
    page_id: str | None = None
    keep: str | None = None


@dataclass(frozen=True)
class DrawTask:
    """The annotated image of the page ``page_id`` to draw with ``draw`` and keep under ``keep``."""

    page_id: str
    keep: str
    draw: Draw


def _init_process(settings: Settings) -> None:
    global _db, _store, _settings
    os.nice(_NICE)
    _db = Database(settings.database_url, pool_size=1)
    _store = open_store(settings)
    _settings = settings


def _build(task: BuildTask) -> bytes:
    """In a build process: the file's bytes, built from the stored results, and kept under ``task.keep``."""
    assert _db is not None and _store is not None, "build process not initialised"
    if task.page_id is not None:
        found = status_reads.get_page(_db, task.page_id)
        data = built_page(_store, found.document, found.job, task.fmt, found.page.page_no)
    else:
        data = built_document(_db, _store, task.document_id, task.fmt, task.page, page_href=PAGE_HREF)
    if task.keep is not None:
        _store.put(task.keep, data, content_type=media_type(task.fmt))
    return data


def _drawn(task: DrawTask) -> bytes:
    """In a build process: the page's annotated image, drawn now from its original and its result, and kept."""
    assert _db is not None and _store is not None and _settings is not None, "build process not initialised"
    found = status_reads.get_page(_db, task.page_id)
    result = page_result(_store, found.job, source=found.document.source, page_no=found.page.page_no)
    data = task.draw(_store, found.job, result, _settings)
    fmt = _settings.worker.annotated_format
    _store.put(task.keep, data, content_type=media_type(fmt))
    return data


class Builder:
    """The API process's build processes, started with the first build."""

    def __init__(self, settings: Settings, *, draw: Draw | None = None) -> None:
        """``draw``: what draws annotated images on request (none: this API draws none)."""
        self._settings = settings
        self.draw = draw
        self._pool: BoundedPool | None = None
        self._lock = threading.Lock()
        self._closed = False

    def build(self, task: BuildTask | DrawTask, *, waiting: Callable[[], None] = lambda: None) -> bytes:
        """``task``'s bytes, built (or drawn) in a build process; ``waiting`` is called once the build is handed
        over (the request gives its turn back: it only waits now). Blocks: call it in a thread. Raises what the
        build raised (NotFound, StorageError, InputError, ...) and ApiError 503 (``build_failed``, ``build_busy``)
        when it did not finish."""
        timeout = self._settings.api.build_timeout
        title = FORMATS[task.fmt].title if isinstance(task, BuildTask) else "annotated image"
        try:
            future = self._started().submit(_build if isinstance(task, BuildTask) else _drawn, task)
        except RuntimeError as exc:  # its processes did not start, or the API is stopping under it
            log.error("no build process for a %s: %s", title, exc)
            raise ApiError(503, "build_failed", f"no process could build the {title} now",
                           {"Retry-After": "5"}) from None
        try:
            waiting()
            return _answer(future, title, timeout * _WAITS)
        finally:
            future.cancel()  # still queued (a wait given up): nobody wants it any more

    @property
    def pids(self) -> list[int]:
        """The build processes' ids (none before the first build)."""
        return self._pool.pids if self._pool is not None else []

    def _started(self) -> BoundedPool:
        with self._lock:
            if self._closed:
                raise RuntimeError("the API is stopping")
            if self._pool is None:
                api = self._settings.api
                self._pool = BoundedPool(api.build_processes, name="build", memory_bytes=api.build_memory_bytes,
                                         timeout=api.build_timeout, initializer=_init_process,
                                         initargs=(self._settings,))
            return self._pool

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


def _answer(future: Future[bytes], title: str, wait: float) -> bytes:
    """The build's bytes, or the 503 that says why there are none."""
    try:
        return future.result(timeout=wait)
    except FutureTimeout:
        raise ApiError(503, "build_busy", f"the {title} could not be built within {wait:g} s: builds are queued "
                       "behind others; try again", {"Retry-After": "5"}) from None
    except TaskFailed as exc:  # its process killed (past its limits) or dead, and replaced
        raise ApiError(503, "build_failed", f"building the {title} failed: {exc} (api.build_timeout, "
                       "api.build_memory_bytes)", {"Retry-After": "5"}) from None
    except PaperlaneError:
        raise
    except MemoryError:
        raise ApiError(503, "build_failed", f"building the {title} needed more memory than a build may have "
                       "(api.build_memory_bytes)", {"Retry-After": "5"}) from None
    except Exception:  # a bug in a build: the log has it, the client a short reason
        log.exception("building a %s failed", title)
        raise ApiError(503, "build_failed", f"building the {title} failed (internal error)",
                       {"Retry-After": "5"}) from None
