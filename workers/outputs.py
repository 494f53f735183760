"""Every output format of a page or a document, by name: what ``paperlane run --formats``, the worker's
``output_formats`` and the API's ``?format=`` dispatch over. The archive formats come from
``paperlane.formats``; JSON, markdown and the searchable PDF from ``paperlane.workers.docout``.

    page_output(fmt, result, *, name, page_count=1, original=None, ext="") -> bytes
    document_output(fmt, pages, *, document_id, source, name, original=None, ext="") -> bytes

Both raise ``UsageError`` for a format that has no such form (``FORMATS[fmt].page`` / ``.document``
say which do). Suffixes and media types: ``paperlane.formats.FORMATS``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from paperlane.formats import FORMATS, document_bytes, page_bytes
from paperlane.schemas import OutputFormat, PageResult
from paperlane.workers.docout import document_json, document_markdown, searchable_pdf

__all__ = ["FORMATS", "document_output", "page_output"]

def page_output(fmt: OutputFormat, result: PageResult, *, name: str, page_count: int = 1,
                original: bytes | None = None, ext: str = "", created: datetime | None = None) -> bytes:
    """One page in ``fmt``; ``original`` (the document's file, for the PDF) and ``ext`` name its image."""
    if fmt is OutputFormat.JSON:
        return json.dumps(result.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":")).encode()
    if fmt is OutputFormat.MD:
        return document_markdown([result]).encode()
    if fmt is OutputFormat.PDF:
        return searchable_pdf([result], original=original, ext=ext)
    return page_bytes(fmt, result, name=name, page_count=page_count, ext=ext, created=created)

def document_output(fmt: OutputFormat, pages: Sequence[PageResult], *, document_id: str, source: str, name: str,
                    original: bytes | None = None, ext: str = "") -> bytes:
    """A whole document in ``fmt`` (its pages in page order, failed ones marked)."""
    if fmt is OutputFormat.JSON:
        return document_json(document_id=document_id, source=source, name=name, pages=pages)
    if fmt is OutputFormat.MD:
        return document_markdown(pages).encode()
    if fmt is OutputFormat.PDF:
        return searchable_pdf(pages, original=original, ext=ext)
    return document_bytes(fmt, pages, document_id=document_id, name=name, ext=ext)
