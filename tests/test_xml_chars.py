"""Hypothesis over the archive formats' builders: any Unicode in a document's name, its extension, its id, the
engine's text, words, markdown and failure reasons gives well-formed XML that its schema accepts (ALTO 4.4,
PAGE XML 2019, METS; hOCR is parsed as XML), and a character XML 1.0 forbids never reaches the bytes: names are
written with it replaced by U+FFFD (``paperlane.formats.xmlchars``), engine text without it."""

from __future__ import annotations

import io
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree

from paperlane.formats import ARCHIVE_FORMATS, Content, document_bytes, document_files, page_bytes
from paperlane.formats.xmlchars import FORBIDDEN, REPLACEMENT, xml_safe
from paperlane.schemas import EngineInfo, JobStatus, Line, OutputFormat, PageResult, Task, Word
from tests.test_formats import _quad, _valid, alto_schema, mets_schema, page_schema  # noqa: F401 (fixtures)

ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
NAMES = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF), min_size=1, max_size=40)
_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _page(number: int, texts: list[str], words: list[str], markdown: str, error: str, engine: str,
          kind: int) -> PageResult:
    engine_info = EngineInfo(name=engine or "x", version=engine, model=engine)
    if kind == 0:  # lines with boxes, the first with the engine's own words
        lines = [Line(text=t, confidence=0.9, quad=_quad(10, 40 * i + 10, 300, 30),
                      words=[Word(text=w, quad=_quad(10 + 40 * j, 40 * i + 10, 30, 30)) for j, w in enumerate(words)]
                      if i == 0 else []) for i, t in enumerate(texts)]
        return PageResult(job_id=f"j{number}", source="s", page=number, status=JobStatus.SUCCEEDED,
                          text="\n".join(texts), lines=lines, width=1000, height=1400, engine=engine_info)
    if kind == 1:  # markdown without geometry
        return PageResult(job_id=f"j{number}", source="s", page=number, status=JobStatus.SUCCEEDED, task=Task.PARSE,
                          text=markdown, markdown=markdown, engine=engine_info)
    return PageResult(job_id=f"j{number}", source="s", page=number, status=JobStatus.FAILED, error=error)


PAGES = st.lists(st.builds(lambda *a: a, st.lists(ANY_TEXT, min_size=1, max_size=3), st.lists(ANY_TEXT, max_size=3),
                           ANY_TEXT, ANY_TEXT, ANY_TEXT, st.integers(0, 2)), min_size=1, max_size=3)


def _clean(data: bytes) -> etree._Element:
    text = data.decode("utf-8")  # strict: a lone surrogate could not have been encoded
    assert not FORBIDDEN.search(text)
    return etree.fromstring(data)  # well-formed, or this raises


@_SETTINGS
@given(name=NAMES, ext=ANY_TEXT, document_id=NAMES, pages=PAGES)
def test_any_unicode_in_names_and_text_gives_valid_archive_formats(
        name: str, ext: str, document_id: str, pages: list[tuple[Any, ...]], alto_schema: Any,  # noqa: F811
        page_schema: Any, mets_schema: Any) -> None:  # noqa: F811
    results = [_page(n, *p) for n, p in enumerate(pages, start=1)]
    count = len(results)
    for result in results:
        for fmt in (OutputFormat.ALTO, OutputFormat.PAGE, OutputFormat.HOCR):
            made = page_bytes(fmt, result, name=name, ext=ext, page_count=count)
            _clean(made)
            if fmt is OutputFormat.ALTO:
                _valid(alto_schema, made)
            elif fmt is OutputFormat.PAGE:
                _valid(page_schema, made)
    mets = document_bytes(OutputFormat.METS, results, document_id=document_id, name=name, ext=ext)
    root = _clean(mets)
    _valid(mets_schema, mets)
    assert root.get("LABEL") == xml_safe(name) and root.get("OBJID") == xml_safe(document_id)
    for fmt in (OutputFormat.ALTO, OutputFormat.HOCR):
        made = document_bytes(fmt, results, document_id=document_id, name=name, ext=ext)
        _clean(made)
        if fmt is OutputFormat.ALTO:
            _valid(alto_schema, made)
    content = Content(results, name=name, ext=ext, document_id=document_id)
    for data in document_files(ARCHIVE_FORMATS, content).values():
        _clean(data)


@pytest.mark.parametrize("forbidden", ["\x00", "\x01", "\x0b", "\x1f", "\ud800", "\udfff", "\ufffe", "\uffff"])
def test_the_rule_replaces_each_forbidden_character_one_for_one(forbidden: str) -> None:
    assert xml_safe(f"a{forbidden}b") == f"a{REPLACEMENT}b"
    kept = "tab\tnewline\nreturn\r é 北 \U0001f600 \ufffd <&>\"'"
    assert xml_safe(kept) == kept
    alto = page_bytes(OutputFormat.ALTO, _page(1, ["x"], [], "", "", "e", 0), name=f"scan{forbidden}", ext=".jpg")
    assert b"scan\xef\xbf\xbd.jpg" in alto  # U+FFFD in UTF-8
