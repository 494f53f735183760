"""A document's text in reading order as markdown, page after page.

A failed page has the quoted line ``> page N failed: reason`` where its text would be (one without a final
result, ``> page N has no result (queued)``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from paperlane.formats.content import Content
from paperlane.formats.registry import Format
from paperlane.formats.view import page_problem
from paperlane.schemas import PageResult, Task
from paperlane.status import JobStatus


def document_markdown(pages: Sequence[PageResult]) -> str:
    """The document's text in reading order, page after page, pages apart by a rule (``---``).

    Each page opens with ``<!-- page N -->``, then its markdown (``parse``), its text (the other
    tasks) or its fields as a fenced JSON block (``fields``). A failed page has the quoted line
    ``> page N failed: reason`` instead (one not final, ``> page N has no result (queued)``); missing
    fields and a truncated answer get a quoted note.
    """
    return "\n\n---\n\n".join(_page_markdown(p) for p in sorted(pages, key=lambda p: p.page)) + "\n"


def _page_markdown(result: PageResult) -> str:
    parts = [f"<!-- page {result.page} -->"]
    if result.status is not JobStatus.SUCCEEDED:
        return "\n\n".join([*parts, f"> {page_problem(result)}"])
    if result.task is Task.FIELDS:
        parts.append(_fenced(json.dumps(result.fields or {}, ensure_ascii=False, indent=2), "json"))
    else:
        parts.append((result.markdown if result.markdown is not None else result.text).strip())
    if result.missing_fields:
        parts.append(f"> page {result.page}: not found on the page: {', '.join(result.missing_fields)}")
    if result.truncated:
        parts.append(f"> page {result.page}: the engine stopped at its token limit; this page is incomplete")
    return "\n\n".join(part for part in parts if part)


def _fenced(body: str, lang: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)  # a fence the body cannot close
    return f"{fence}{lang}\n{body}\n{fence}"


def build_page(content: Content, number: int, _spec: Format) -> bytes:
    return document_markdown([content.result(number)]).encode()


def build_document(content: Content, _spec: Format) -> bytes:
    return document_markdown(content.results).encode()
