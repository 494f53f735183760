"""Every output of paperlane, by name: JSON, markdown, the searchable PDF, ALTO, PAGE XML, hOCR, METS and the
annotated image, each a registered format (``paperlane.formats.registry``) built through one entry point::

    build(fmt, content, page=None) -> bytes        # a document's file (page None) or page N's
    file_name(stem, fmt, page=None, page_count=1)  # "scan.alto.xml", "scan-p3.page.xml"
    document_files(formats, content)               # every file those formats make of a document
    media_type(fmt)                                # what the file is served and stored as

Pure functions of page results (no database, no storage, nothing from the workers, the producer or storage):
the caller reads the results (and the original, for the PDF) into a ``Content`` and writes what comes back, so
a document's files are the same bytes wherever they are built. A page that did not succeed is never dropped:
each format writes it with the reason. Each page's text and boxes come from one view of it
(``paperlane.formats.view``), made once however many formats are written.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from paperlane.errors import UsageError, public_reason
from paperlane.formats.content import Content
from paperlane.formats.registry import (ARCHIVE_FORMATS, FORMATS, REGISTRY, Format, FormatKey, Scope, file_name,
                                        format_of, lookup, media_type, media_type_of)
from paperlane.schemas import OutputFormat, PageResult

if TYPE_CHECKING:
    from paperlane.formats.view import PageView

__all__ = ["ARCHIVE_FORMATS", "FORMATS", "REGISTRY", "Content", "FileKey", "Format", "FormatKey", "Scope", "build",
           "document_bytes", "document_files", "file_name", "format_of", "lookup", "media_type", "media_type_of",
           "page_bytes"]

log = logging.getLogger(__name__)

FileKey = tuple[OutputFormat, "int | None"]  # a format's file: the document's (None) or a page's


def build(fmt: FormatKey, content: Content, *, page: int | None = None) -> bytes:
    """``content`` in ``fmt``: the whole document's file (``page`` None) or page ``page``'s alone.

    Raises UsageError for a form the format lacks (``lookup(fmt).scopes`` says which it has), and what its
    builder raises (PaperlaneError when the searchable PDF or the annotated image cannot be made)."""
    spec = lookup(fmt)
    module = importlib.import_module(f"paperlane.formats.{spec.module}")
    if page is None:
        if not spec.document:
            raise UsageError(f"{spec.key.value} has no whole-document form: it holds one page a file")
        return bytes(module.build_document(content, spec))
    if not spec.page:
        raise UsageError(f"{spec.key.value} is a document's only: it has no form for a page alone")
    return bytes(module.build_page(content, page, spec))


def document_files(formats: Collection[OutputFormat], content: Content) -> dict[FileKey, bytes]:
    """Every file ``formats`` make of the document, keyed by format and page: a document-scope format's one file
    (page None), a page-scope format's file for each page, and each page's file in a format's companions (METS
    lists each page's ALTO and PAGE XML). A document of one page has only page None (``file_name`` names its
    page's file the same). A best-effort format that cannot be made is left out, the reason logged."""
    several = content.count > 1
    files: dict[FileKey, bytes] = {}
    for fmt, spec in FORMATS.items():
        if fmt not in formats:
            continue
        if spec.document:
            try:
                files[(fmt, None)] = build(fmt, content)
            except Exception as exc:
                if not spec.best_effort:
                    raise
                log.warning("document %s: no %s (%s)", content.document_id, fmt.value, public_reason(exc),
                            exc_info=exc)
        for each in ((fmt,) if not spec.document else ()) + spec.companions:
            for view in content.views:
                key: FileKey = (each, view.number if several else None)
                if key not in files:
                    files[key] = build(each, content, page=view.number)
    return files


# -- shorthands for one page or one document (tests, benchmarks) -------------------------------------------------

def page_bytes(fmt: FormatKey, page: PageResult | PageView, *, name: str, page_count: int = 1, ext: str = "",
               created: datetime | None = None, original: bytes | None = None) -> bytes:
    """One page in ``fmt``: ``build`` of a ``Content`` holding it (``name`` and ``ext`` name the original)."""
    number = page.page if isinstance(page, PageResult) else page.number
    content = Content([page], name=name, ext=ext, page_count=page_count,
                      created={number: created} if created is not None else {}, original=lambda: original)
    return build(fmt, content, page=number)


def document_bytes(fmt: FormatKey, pages: Sequence[PageResult | PageView], *,
                   document_id: str, name: str, ext: str = "", source: str = "", stem: str | None = None,
                   original: bytes | None = None) -> bytes:
    """A whole document in ``fmt``: ``build`` of a ``Content`` holding ``pages``."""
    return build(fmt, Content(pages, name=name, ext=ext, document_id=document_id, source=source, stem=stem,
                              original=lambda: original))
