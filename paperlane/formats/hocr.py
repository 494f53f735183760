"""hOCR 1.2 (XHTML) for a page or a whole document (an ``ocr_page`` per page, in page order).

``ocr_page`` (``image``, ``bbox`` of the page, ``ppageno``) > ``ocr_carea`` a block (a table's is
inside an ``ocr_table``) > ``ocr_par`` > ``ocr_line`` (``ocr_header`` / ``ocr_footer`` in header and
footer blocks) > ``ocrx_word`` with ``bbox`` and ``x_wconf`` (0-100: the word's confidence, else its
line's). The head's ``ocr-system`` names paperlane, its version, the engine and the model, and
``ocr-capabilities`` lists what is used. A box paperlane laid out itself has the engine-specific
property ``x_estimated 1``; a page without text, ``x_note "page 3 failed: ..."`` on its ``ocr_page``
(and ``x_review "flags"`` one its quality grade wants reviewed). hOCR boxes are axis-aligned: a
slanted line's box is the one around its quad.

Written with lxml's incremental writer (``etree.xmlfile``): no tree is built, each element goes out as it
is made, with its attributes and text escaped by lxml.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from functools import lru_cache

from lxml import etree

from paperlane.formats.content import Content
from paperlane.formats.registry import Format
from paperlane.formats.view import BlockView, Box, LineView, PageView, as_view, producer
from paperlane.schemas import BlockKind, PageResult

NS = "http://www.w3.org/1999/xhtml"
_DOCTYPE = ('<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN" '
            '"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">')
_CAPABILITIES = "ocr_page ocr_carea ocr_par ocr_line ocr_header ocr_footer ocr_table ocrx_word ocrp_wconf ocrp_dir"
_LINE_CLASS = {BlockKind.HEADER: "ocr_header", BlockKind.FOOTER: "ocr_footer"}
_XML = "http://www.w3.org/XML/1998/namespace"
_NSMAP = {None: NS, "xml": _XML}  # the xml prefix declared (as XML allows), else lxml's writer invents one
_DIV, _P, _SPAN = f"{{{NS}}}div", f"{{{NS}}}p", f"{{{NS}}}span"


def page_hocr(page: PageResult | PageView, *, image_name: str) -> bytes:
    """The page's hOCR (UTF-8 XHTML); ``image_name`` is its image file (the page's ``image`` property)."""
    view = as_view(page)
    return document_hocr([view], image_names={view.number: image_name})


def document_hocr(pages: Sequence[PageResult | PageView], *, image_names: Mapping[int, str]) -> bytes:
    """One hOCR holding every page of a document in page order; ``image_names``: each page number's image."""
    views = sorted((as_view(p) for p in pages), key=lambda v: v.number)
    out = io.BytesIO()
    with etree.xmlfile(out, encoding="UTF-8") as xf:
        xf.write_declaration()
        xf.write_doctype(_DOCTYPE)
        with xf.element(f"{{{NS}}}html", {f"{{{_XML}}}lang": "und"}, nsmap=_NSMAP):
            with xf.element(f"{{{NS}}}head"):
                with xf.element(f"{{{NS}}}title"):
                    xf.write("hOCR")
                for meta in ({"http-equiv": "Content-Type", "content": "text/html;charset=utf-8"},
                             {"name": "ocr-system", "content": producer([v.engine for v in views])},
                             {"name": "ocr-capabilities", "content": _CAPABILITIES},
                             {"name": "ocr-number-of-pages", "content": str(len(views))}):
                    with xf.element(f"{{{NS}}}meta", meta):
                        pass
            with xf.element(f"{{{NS}}}body"):
                for index, view in enumerate(views):
                    _page(xf, view, image_names.get(view.number, ""), index)
    return out.getvalue()


def _quoted(text: str) -> str:
    """A string property's value: hOCR's title grammar has no escapes, so quotes and semicolons go."""
    return '"' + " ".join(text.replace('"', "'").replace(";", ",").split()) + '"'


_BBOX = "bbox %d %d %d %d"


def _bbox(box: Box) -> str:
    return _BBOX % box


def _page(xf: etree.xmlfile, view: PageView, image: str, index: int) -> None:
    title = [f"image {_quoted(image)}", f"bbox 0 0 {view.width or 0} {view.height or 0}", f"ppageno {index}"]
    if view.note:
        title.append(f"x_note {_quoted(view.note)}")
    if view.needs_review:
        title.append(f"x_review {_quoted(', '.join(view.flags) or 'needs review')}")
    with xf.element(_DIV, {"class": "ocr_page", "id": f"page_{view.number}", "title": "; ".join(title)}):
        for b, block in enumerate(view.blocks, 1):
            _block(xf, block, f"{view.number}_{b}", rtl=view.rtl)


def _block(xf: etree.xmlfile, block: BlockView, block_id: str, *, rtl: bool) -> None:
    bbox = _bbox(block.box)
    with (xf.element(_DIV, {"class": "ocr_table", "id": f"table_{block_id}", "title": bbox})
          if block.kind is BlockKind.TABLE else nullcontext()):
        par = {"class": "ocr_par", "id": f"par_{block_id}", "title": bbox} | ({"dir": "rtl"} if rtl else {})
        with xf.element(_DIV, {"class": "ocr_carea", "id": f"block_{block_id}", "title": bbox}), xf.element(_P, par):
            css = _LINE_CLASS.get(block.kind, "ocr_line")
            for n, line in enumerate(block.lines, 1):
                _line(xf, line, f"{block_id}_{n}", css)


def _line(xf: etree.xmlfile, line: LineView, line_id: str, css: str) -> None:
    element, write = xf.element, xf.write
    last = len(line.words)
    with element(_SPAN, {"class": css, "id": f"line_{line_id}",
                         "title": _bbox(line.box) + ("; x_estimated 1" if line.estimated else "")}):
        write("\n")
        for w, word in enumerate(line.words, 1):  # this runs for every word: no call it can do without
            title = _BBOX % word.box
            if word.confidence is not None:
                title += _wconf(word.confidence)
            if word.estimated:
                title += "; x_estimated 1"
            with element(_SPAN, {"class": "ocrx_word", "id": f"word_{line_id}_{w}", "title": title}):
                write(word.text)
            write(" " if w < last else "\n")


@lru_cache(maxsize=4096)
def _wconf(confidence: float) -> str:
    """The ``x_wconf`` property (0-100); remembered: a line's words share their confidence."""
    return f"; x_wconf {round(min(max(confidence, 0.0), 1.0) * 100)}"


def build_page(content: Content, number: int, _spec: Format) -> bytes:
    return page_hocr(content.view(number), image_name=content.image_name(number))


def build_document(content: Content, _spec: Format) -> bytes:
    return document_hocr(content.views, image_names={v.number: content.image_name(v.number) for v in content.views})
