"""hOCR 1.2 (XHTML) for a page or a whole document (an ``ocr_page`` per page, in page order).

``ocr_page`` (``image``, ``bbox`` of the page, ``ppageno``) > ``ocr_carea`` a block (a table's is
inside an ``ocr_table``) > ``ocr_par`` > ``ocr_line`` (``ocr_header`` / ``ocr_footer`` in header and
footer blocks) > ``ocrx_word`` with ``bbox`` and ``x_wconf`` (0-100: the word's confidence, else its
line's). The head's ``ocr-system`` names paperlane, its version, the engine and the model, and
``ocr-capabilities`` lists what is used. A box paperlane laid out itself has the engine-specific
property ``x_estimated 1``; a page without text, ``x_note "page 3 failed: ..."`` on its ``ocr_page``
(and ``x_review "flags"`` one its quality grade wants reviewed). hOCR boxes are axis-aligned: a
slanted line's box is the one around its quad.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lxml import etree

from paperlane.formats.view import BlockView, LineView, PageView, page_view, pixel_box, producer, word_confidence
from paperlane.schemas import BlockKind, PageResult

NS = "http://www.w3.org/1999/xhtml"
_DOCTYPE = ('<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN" '
            '"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">')
_CAPABILITIES = "ocr_page ocr_carea ocr_par ocr_line ocr_header ocr_footer ocr_table ocrx_word ocrp_wconf ocrp_dir"
_LINE_CLASS = {BlockKind.HEADER: "ocr_header", BlockKind.FOOTER: "ocr_footer"}


def page_hocr(result: PageResult, *, image_name: str) -> bytes:
    """The page's hOCR (UTF-8 XHTML); ``image_name`` is its image file (the page's ``image`` property)."""
    return document_hocr([result], image_names={result.page: image_name})


def document_hocr(pages: Sequence[PageResult], *, image_names: Mapping[int, str]) -> bytes:
    """One hOCR holding every page of a document in page order; ``image_names``: each page number's image."""
    ordered = sorted(pages, key=lambda p: p.page)
    root = etree.Element(f"{{{NS}}}html", nsmap={None: NS})
    root.set("{http://www.w3.org/XML/1998/namespace}lang", "und")
    head = _sub(root, "head")
    _sub(head, "title").text = "hOCR"
    _sub(head, "meta", **{"http-equiv": "Content-Type", "content": "text/html;charset=utf-8"})
    _sub(head, "meta", name="ocr-system", content=producer([p.engine for p in ordered]))
    _sub(head, "meta", name="ocr-capabilities", content=_CAPABILITIES)
    _sub(head, "meta", name="ocr-number-of-pages", content=str(len(ordered)))
    body = _sub(root, "body")
    for index, result in enumerate(ordered):
        _page(body, page_view(result), image_names.get(result.page, ""), index)
    return etree.tostring(root, xml_declaration=True, encoding="UTF-8", doctype=_DOCTYPE, pretty_print=True)


def _sub(parent: etree._Element, tag: str, **attrs: str) -> etree._Element:
    return etree.SubElement(parent, f"{{{NS}}}{tag}", attrs)


def _quoted(text: str) -> str:
    """A string property's value: hOCR's title grammar has no escapes, so quotes and semicolons go."""
    return '"' + " ".join(text.replace('"', "'").replace(";", ",").split()) + '"'


def _bbox(quad: Sequence[tuple[float, float]]) -> str:
    left, top, width, height = pixel_box(quad)
    return f"bbox {left} {top} {left + width} {top + height}"


def _page(body: etree._Element, view: PageView, image: str, index: int) -> None:
    title = [f"image {_quoted(image)}", f"bbox 0 0 {view.width or 0} {view.height or 0}", f"ppageno {index}"]
    if view.note:
        title.append(f"x_note {_quoted(view.note)}")
    if view.needs_review:
        title.append(f"x_review {_quoted(', '.join(view.flags) or 'needs review')}")
    page = _sub(body, "div", **{"class": "ocr_page", "id": f"page_{view.number}", "title": "; ".join(title)})
    for b, block in enumerate(view.blocks, 1):
        _block(page, block, f"{view.number}_{b}", rtl=view.rtl)


def _block(page: etree._Element, block: BlockView, block_id: str, *, rtl: bool) -> None:
    parent = page
    if block.kind is BlockKind.TABLE:
        parent = _sub(page, "div", **{"class": "ocr_table", "id": f"table_{block_id}", "title": _bbox(block.quad)})
    area = _sub(parent, "div", **{"class": "ocr_carea", "id": f"block_{block_id}", "title": _bbox(block.quad)})
    par = _sub(area, "p", **{"class": "ocr_par", "id": f"par_{block_id}", "title": _bbox(block.quad)})
    if rtl:
        par.set("dir", "rtl")
    for n, line in enumerate(block.lines, 1):
        _line(par, line, f"{block_id}_{n}", _LINE_CLASS.get(block.kind, "ocr_line"))


def _line(par: etree._Element, line: LineView, line_id: str, css: str) -> None:
    title = _bbox(line.quad) + ("; x_estimated 1" if line.estimated else "")
    element = _sub(par, "span", **{"class": css, "id": f"line_{line_id}", "title": title})
    element.text = "\n"
    for w, word in enumerate(line.words, 1):
        parts = [_bbox(word.quad)]
        confidence = word_confidence(line, word)
        if confidence is not None:
            parts.append(f"x_wconf {round(min(max(confidence, 0.0), 1.0) * 100)}")
        if word.estimated:
            parts.append("x_estimated 1")
        span = _sub(element, "span", **{"class": "ocrx_word", "id": f"word_{line_id}_{w}", "title": "; ".join(parts)})
        span.text = word.text
        span.tail = " " if w < len(line.words) else "\n"
