"""A finished document's outputs (its JSON, its markdown, a searchable PDF), written as a unit of work that is
recorded before it is done (``storage.outputs``) and retried by the retry policy until it is.

The worker that finishes a document's last page writes them at once (``write``); a worker's ``OutputsSweep``
writes any whose writer died or whose failed try is due again (``write_due``); ``paperlane run`` writes them as
each document ends. They are built from what is stored (each page's result JSON and the document's original),
so whoever writes them builds the same objects. Each page's result is its job's, told which document and page
it is (a job shared by several documents carries the first one's source).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from paperlane.errors import public_reason
from paperlane.pdfium import LOCK as PDFIUM_LOCK
from paperlane.retry import RetryPolicy
from paperlane.schemas import PageResult
from paperlane.status import OutputsState
from paperlane.storage import ingests
from paperlane.storage import outputs as recorded
from paperlane.storage.db import Database, utcnow
from paperlane.storage.objects import ObjectStore, document_keys
from paperlane.storage.results import page_result
from paperlane.storage.tables import DocumentRow
from paperlane.workers.document_files import document_json, document_markdown, searchable_pdf

log = logging.getLogger(__name__)


@dataclass
class DocumentOutputs:
    document: DocumentRow
    pages: list[PageResult]
    json: bytes
    markdown: bytes
    pdf: bytes | None  # None when it could not be built (the reason is logged)


@dataclass(frozen=True)
class Writer:
    """What writing outputs needs: where to read and write, the retry policy, how long a claim holds."""

    db: Database
    store: ObjectStore
    policy: RetryPolicy
    hold: float  # seconds a claim holds the outputs (then another writer may take them)
    max_pixels: int = 150_000_000

    def write(self, document_id: str) -> DocumentOutputs | None:
        """Claim the document's due outputs and write them; None when they are not due, another writer holds
        them, or this try failed (recorded for a retry, or as failed)."""
        held = recorded.claim(self.db, document_id, now=utcnow(), hold=self.hold)
        return self._written(held) if held is not None else None

    def write_due(self, *, limit: int = 10) -> int:
        """Write outputs nobody holds that are due (their writer died, or a failed try's backoff is over); how
        many documents were written."""
        return sum(self._written(held) is not None
                   for held in recorded.claim_due(self.db, now=utcnow(), hold=self.hold, limit=limit))

    def _written(self, held: recorded.Claim) -> DocumentOutputs | None:
        try:
            built = build_outputs(self.db, self.store, held.document_id, max_pixels=self.max_pixels)
            json_key, md_key, pdf_key = document_keys(held.document_id)
            self.store.put(json_key, built.json, content_type="application/json")
            self.store.put(md_key, built.markdown, content_type="text/markdown; charset=utf-8")
            if built.pdf is not None:
                self.store.put(pdf_key, built.pdf, content_type="application/pdf")
            recorded.written(self.db, held, json_key=json_key, markdown_key=md_key,
                             pdf_key=pdf_key if built.pdf is not None else None)
            return built
        except Exception as exc:
            state = self._failed(held, exc)
            log.warning("document %s: outputs not written (%s); %s", held.document_id, public_reason(exc),
                        "given up" if state is OutputsState.FAILED else "due again later", exc_info=exc)
            return None

    def _failed(self, held: recorded.Claim, exc: Exception) -> OutputsState:
        try:
            return recorded.failed_try(self.db, held, exc, policy=self.policy, now=utcnow())
        except Exception as record_exc:  # the database is down too: the claim lapses and a sweep tries again
            log.warning("document %s: failed try not recorded (%s)", held.document_id, public_reason(record_exc))
            return OutputsState.PENDING


def build_outputs(db: Database, store: ObjectStore, document_id: str, *,
                  max_pixels: int = 150_000_000) -> DocumentOutputs:
    """Read the document's pages and original and build its outputs (nothing is written)."""
    document = ingests.get_document(db, document_id)
    pages = [page_result(store, job, source=document.source, page_no=page.page_no)
             for page, job in ingests.document_pages(db, document_id)]
    doc_json = document_json(document_id=document.id, source=document.source, name=document.name, pages=pages)
    markdown = document_markdown(pages).encode()
    pdf = None
    try:
        original = store.get(document.original_key) if document.original_key else None
        with PDFIUM_LOCK:
            pdf = searchable_pdf(pages, original=original, ext=document.ext, max_pixels=max_pixels)
    except Exception as exc:  # the JSON and markdown still go out; the PDF's absence is logged
        log.warning("document %s: no searchable PDF (%s)", document_id, public_reason(exc), exc_info=exc)
    return DocumentOutputs(document, pages, doc_json, markdown, pdf)


class OutputsSweep:
    """A worker's thread that writes due outputs nobody holds, every ``every`` seconds: one query on a partial
    index when there are none."""

    def __init__(self, writer: Writer, *, every: float) -> None:
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
