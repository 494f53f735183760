"""A document's outputs once its last page is final: its JSON, its markdown and a searchable PDF.

Built from what is stored (each page's result JSON and the document's original), so whichever
worker finishes the last page can build them, and building them twice writes the same objects.
Each page's result is its job's, told which document and page it is (a job shared by several
documents carries the first one's source).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from paperlane.errors import public_reason
from paperlane.pdfium import LOCK as PDFIUM_LOCK
from paperlane.schemas import PageResult
from paperlane.storage import ingests
from paperlane.storage.db import Database
from paperlane.storage.objects import ObjectStore, document_keys
from paperlane.storage.results import page_result
from paperlane.storage.tables import DocumentRow
from paperlane.workers.docout import document_json, document_markdown, searchable_pdf

log = logging.getLogger(__name__)


@dataclass
class DocumentOutputs:
    document: DocumentRow
    pages: list[PageResult]
    json: bytes
    markdown: bytes
    pdf: bytes | None  # None when it could not be built (the reason is logged)


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


def write_outputs(db: Database, store: ObjectStore, document_id: str, *,
                  max_pixels: int = 150_000_000) -> DocumentOutputs:
    """Build the document's outputs and store them; the document row records where."""
    outputs = build_outputs(db, store, document_id, max_pixels=max_pixels)
    json_key, md_key, pdf_key = document_keys(document_id)
    store.put(json_key, outputs.json, content_type="application/json")
    store.put(md_key, outputs.markdown, content_type="text/markdown; charset=utf-8")
    if outputs.pdf is not None:
        store.put(pdf_key, outputs.pdf, content_type="application/pdf")
    ingests.set_outputs(db, document_id, json_key=json_key, markdown_key=md_key,
                        pdf_key=pdf_key if outputs.pdf is not None else None)
    return outputs
