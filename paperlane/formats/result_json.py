"""A page's result JSON and a document's JSON (every page's result in page order, with counts by status).

The same pages always give the same bytes. A page that failed keeps its result (``status``, ``error``) and is
listed in ``failed_pages``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

from paperlane.formats.content import Content
from paperlane.formats.registry import Format
from paperlane.schemas import PageResult
from paperlane.status import JobStatus


def page_json(result: PageResult) -> bytes:
    """A page's result JSON, compact UTF-8: what is stored for it, and its ``?format=json``."""
    return result.model_dump_json().encode()


def document_json(*, document_id: str, source: str, name: str, pages: Sequence[PageResult]) -> bytes:
    """The document JSON, UTF-8: its ids, ``page_count``, ``counts`` by status (every status a key),
    ``failed_pages`` (page numbers) and ``pages``: every page's full result in page order.

    Indented two spaces; the pages are serialised by pydantic (json's indenting encoder is pure Python, and
    took 8 ms for one page of 45 kB) and spliced in at their depth."""
    ordered = sorted(pages, key=lambda p: p.page)
    counts = Counter(p.status for p in ordered)
    doc = {
        "document_id": document_id, "source": source, "name": name, "page_count": len(ordered),
        "counts": {status.value: counts[status] for status in JobStatus},
        "failed_pages": [p.page for p in ordered if p.status is JobStatus.FAILED],
    }
    head = json.dumps(doc, ensure_ascii=False, indent=2)[:-2]  # without its closing "\n}"
    if not ordered:
        return (head + ',\n  "pages": []\n}\n').encode()
    body = ",\n    ".join(p.model_dump_json(indent=2).replace("\n", "\n    ") for p in ordered)
    return (head + ',\n  "pages": [\n    ' + body + "\n  ]\n}\n").encode()


def build_page(content: Content, number: int, _spec: Format) -> bytes:
    return page_json(content.result(number))


def build_document(content: Content, _spec: Format) -> bytes:
    return document_json(document_id=content.document_id, source=content.source, name=content.name,
                         pages=content.results)
