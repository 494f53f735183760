"""A finished document's outputs in the formats asked for (by default its JSON, its markdown and a searchable PDF;
also ALTO, PAGE XML, hOCR and METS), written as a unit of work that is recorded before it is done
(``storage.outputs``) and retried by the retry policy until it is.

The worker that finishes a document's last page writes them at once (``write``); a worker's ``OutputsSweep``
writes any whose writer died or whose failed try is due again (``write_due``); ``paperlane run`` writes them as
each document ends. They are built from what is stored (each page's result JSON and the document's original),
so whoever writes them builds the same objects (PAGE XML's time is when its page was finished). Each page's
result is its job's, told which document and page it is (a job shared by several documents carries the first
one's source). Each file is stored under the document's key for its format and page, and the formats written are
recorded with the outputs' state (a searchable PDF that could not be made is left out, and the reason logged).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from paperlane.errors import public_reason
from paperlane.formats import FileKey, document_files, media_type
from paperlane.retry import RetryPolicy
from paperlane.schemas import OutputFormat, PageResult
from paperlane.settings import DEFAULT_OUTPUT_FORMATS
from paperlane.status import OutputsState
from paperlane.storage import outputs as recorded
from paperlane.storage.db import Database, utcnow
from paperlane.storage.objects import ObjectStore, document_key
from paperlane.storage.results import Known, document_content, document_results
from paperlane.storage.tables import DocumentRow

log = logging.getLogger(__name__)


@dataclass
class DocumentOutputs:
    document: DocumentRow
    pages: list[PageResult]  # in page order
    files: dict[FileKey, bytes]  # every file made: (format, None) a document's, (format, N) page N's
    formats: list[OutputFormat]  # the formats asked for that were made (a PDF that could not be is not)


@dataclass(frozen=True)
class Writer:
    """What writing outputs needs: where to read and write, the retry policy, how long a claim holds."""

    db: Database
    store: ObjectStore
    policy: RetryPolicy
    hold: float  # seconds a claim holds the outputs (then another writer may take them)
    max_pixels: int = 150_000_000
    formats: tuple[OutputFormat, ...] = DEFAULT_OUTPUT_FORMATS

    def write(self, document_id: str, *, known: Known | None = None) -> DocumentOutputs | None:
        """Claim the document's due outputs and write them; None when they are not due, another writer holds
        them, or this try failed (recorded for a retry, or as failed). ``known``: job id -> the result this
        process just stored for it, used instead of reading it back."""
        held = self.claim(document_id)
        return self.write_held(held, known) if held is not None else None

    def claim(self, document_id: str) -> recorded.Claim | None:
        """Claim the document's outputs if they are due and nobody holds them (``storage.outputs.claim``)."""
        return recorded.claim(self.db, document_id, now=utcnow(), hold=self.hold)

    def claim_due(self, *, limit: int = 10) -> list[recorded.Claim]:
        """Claim due outputs nobody holds (``storage.outputs.claim_due``)."""
        return recorded.claim_due(self.db, now=utcnow(), hold=self.hold, limit=limit)

    def write_due(self, *, limit: int = 10) -> int:
        """Write outputs nobody holds that are due (their writer died, or a failed try's backoff is over); how
        many documents were written."""
        return sum(self.write_held(held) is not None for held in self.claim_due(limit=limit))

    def write_held(self, held: recorded.Claim, known: Known | None = None) -> DocumentOutputs | None:
        """Build and store the outputs ``held`` claims and record them as written; None when this try failed
        (recorded for a retry, or as failed). Never raises."""
        try:
            built = build_outputs(self.db, self.store, held.document_id, formats=self.formats,
                                  max_pixels=self.max_pixels, known=known)
            count = len(built.pages)
            for (fmt, page), data in built.files.items():
                self.store.put(document_key(held.document_id, fmt, page, count), data,
                               content_type=media_type(fmt))
            recorded.written(self.db, held, formats=built.formats)
            return built
        except Exception as exc:
            self.record_failed(held, exc)
            return None

    def record_failed(self, held: recorded.Claim, exc: Exception) -> OutputsState:
        """Record the failed try ``held`` made (``exc``) and log it; the outputs' state after it. Never raises."""
        state = self._recorded_failure(held, exc)
        log.warning("document %s: outputs not written (%s); %s", held.document_id, public_reason(exc),
                    "given up" if state is OutputsState.FAILED else "due again later", exc_info=exc)
        return state

    def _recorded_failure(self, held: recorded.Claim, exc: Exception) -> OutputsState:
        try:
            return recorded.failed_try(self.db, held, exc, policy=self.policy, now=utcnow())
        except Exception as record_exc:  # the database is down too: the claim lapses and a sweep tries again
            log.warning("document %s: failed try not recorded (%s)", held.document_id, public_reason(record_exc))
            return OutputsState.PENDING


def build_outputs(db: Database, store: ObjectStore, document_id: str, *,
                  formats: Collection[OutputFormat] = DEFAULT_OUTPUT_FORMATS,
                  max_pixels: int = 150_000_000, known: Known | None = None) -> DocumentOutputs:
    """Read the document's pages (and its original, for the PDF) and build its outputs in ``formats``; nothing is
    written. Page files are named after the document's id (as the METS refers to them). ``known``: see
    ``storage.results.document_results``."""
    read = document_results(db, store, document_id, known=known)
    content = document_content(store, read.document, read.pages, created=read.finished, max_pixels=max_pixels)
    files = document_files(formats, content)
    made = [fmt for fmt in OutputFormat if fmt in formats and any(key[0] is fmt for key in files)]
    return DocumentOutputs(read.document, read.pages, files, made)


class WritesDue(Protocol):
    def write_due(self, *, limit: int = 10) -> int:
        """Write (or start writing) due outputs nobody holds; how many documents. Raises what the database raises."""
        ...


class OutputsSweep:
    """A worker's thread that writes due outputs nobody holds, every ``every`` seconds: one query on a partial
    index when there are none."""

    def __init__(self, writer: WritesDue, *, every: float) -> None:
        self._writer, self._every = writer, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="outputs", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                if written := self._writer.write_due():
                    log.info("wrote the outputs of %d document(s) due", written)
            except Exception as exc:  # the database is down: nothing is lost, the outputs stay due
                log.warning("outputs sweep: %s", public_reason(exc))
