"""ALTO 4.4 XML for a page or a whole document (one ``Page`` per page, in page order).

Each page: ``Page`` (the image's size in pixels, ``PC``: the page's confidence) holding a
``PrintSpace`` with a ``TextBlock`` per block in reading order (a table is a ``ComposedBlock`` of
``TYPE="table"`` with a block a cell), each ``TextLine`` with its box, a polygon ``Shape`` from its
quad and its words as ``String``s (``WC``: the word's confidence, else its line's) with ``SP`` between.
An explicit ``ReadingOrder`` lists the blocks. ``Description/Processing`` names paperlane, its version,
the engine and the model. Boxes paperlane laid out itself (words along a line, text without geometry)
carry ``TAGREFS`` to the ``OtherTag`` ``ESTIMATED``; header, footer, page-number, heading and caption
blocks to the ``LayoutTag``s of those names. A page without text says why in ``QUALITY_DETAIL`` (``page 3 failed: ...``),
as does a page its quality grade wants reviewed (``needs review: flags``).

Written with lxml's incremental writer (``etree.xmlfile``): no tree is built, each element goes out as it
is made, with its attributes escaped by lxml.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from lxml import etree

from paperlane.formats.content import Content
from paperlane.formats.registry import Format
from paperlane.formats.view import BlockView, Box, LineView, PageView, as_view, confidence_text, points, producer
from paperlane.schemas import BlockKind, EngineInfo, PageResult

NS = "http://www.loc.gov/standards/alto/ns-v4#"
XLINK = "http://www.w3.org/1999/xlink"
XSI = "http://www.w3.org/2001/XMLSchema-instance"
SCHEMA_LOCATION = f"{NS} http://www.loc.gov/alto/v4/alto-4-4.xsd"
_NSMAP = {None: NS, "xlink": XLINK, "xsi": XSI}
_TAGS = {"ESTIMATED": ("OtherTag", "estimated geometry",
                       "laid out by paperlane, not read from the page: words along their line by character "
                       "widths, or text without boxes stacked from the top of the page"),
         "HEADER": ("LayoutTag", "header", "a running head in the top margin"),
         "FOOTER": ("LayoutTag", "footer", "a running foot or page number in the bottom margin"),
         "PAGE-NUMBER": ("LayoutTag", "page-number", "a page number in the margin"),
         "HEADING": ("LayoutTag", "heading", "a title or heading (found by the layout model)"),
         "CAPTION": ("LayoutTag", "caption", "a figure's or a table's caption (found by the layout model)")}
_MARGIN_TAGS = {BlockKind.HEADER: "HEADER", BlockKind.FOOTER: "FOOTER", BlockKind.PAGE_NUMBER: "PAGE-NUMBER",
                BlockKind.HEADING: "HEADING", BlockKind.CAPTION: "CAPTION"}


def _q(tag: str) -> str:
    return f"{{{NS}}}{tag}"


# The tags written once per line or word, qualified once.
_TEXT_BLOCK, _TEXT_LINE, _SHAPE, _POLYGON, _STRING, _SP = map(
    _q, ("TextBlock", "TextLine", "Shape", "Polygon", "String", "SP"))

EngineKey = tuple[str, str, str | None] | None


def page_alto(page: PageResult | PageView, *, image_name: str) -> bytes:
    """The page's ALTO (UTF-8); ``image_name`` is its image file, as ``sourceImageInformation`` names it."""
    return document_alto([page], image_name=image_name)


def document_alto(pages: Sequence[PageResult | PageView], *, image_name: str) -> bytes:
    """One ALTO holding every page of a document in page order (``image_name``: the document's file)."""
    views = sorted((as_view(p) for p in pages), key=lambda v: v.number)
    engines = {key: f"OCR_{k}" for k, key in enumerate(dict.fromkeys(_engine_key(v.engine) for v in views))}
    out = io.BytesIO()
    with etree.xmlfile(out, encoding="UTF-8") as xf:
        xf.write_declaration()
        with xf.element(_q("alto"), {"SCHEMAVERSION": "4.4", f"{{{XSI}}}schemaLocation": SCHEMA_LOCATION},
                        nsmap=_NSMAP):
            _description(xf, image_name, views, engines)
            _tags(xf, views)
            if any(v.blocks for v in views):
                with xf.element(_q("ReadingOrder")), xf.element(_q("OrderedGroup"), {"ID": "RO"}):
                    for v in views:
                        for b in range(1, len(v.blocks) + 1):
                            _leaf(xf, _q("ElementRef"), {"ID": f"RO_P{v.number}_B{b}", "REF": f"P{v.number}_B{b}"})
            with xf.element(_q("Layout")):
                for view in views:
                    _page(xf, view, processing=engines[_engine_key(view.engine)])
    return out.getvalue()


def _leaf(xf: etree.xmlfile, tag: str, attrs: dict[str, str]) -> None:
    with xf.element(tag, attrs):
        pass


def _text(xf: etree.xmlfile, tag: str, text: str) -> None:
    with xf.element(tag):
        xf.write(text)


def _engine_key(engine: EngineInfo | None) -> EngineKey:
    return (engine.name, engine.version, engine.model) if engine else None


def _description(xf: etree.xmlfile, image_name: str, views: Sequence[PageView], engines: dict[EngineKey, str]) -> None:
    from paperlane import __version__

    by_engine = {_engine_key(v.engine): v.engine for v in views}
    with xf.element(_q("Description")):
        _text(xf, _q("MeasurementUnit"), "pixel")
        with xf.element(_q("sourceImageInformation")):
            _text(xf, _q("fileName"), image_name)
        for key, processing_id in engines.items():
            with xf.element(_q("Processing"), {"ID": processing_id}):
                _text(xf, _q("processingCategory"), "contentGeneration")
                _text(xf, _q("processingStepDescription"),
                      "text recognition; blocks and reading order from line geometry (recursive XY-cut)")
                with xf.element(_q("processingSoftware")):
                    _text(xf, _q("softwareCreator"), "paperlane")
                    _text(xf, _q("softwareName"), "paperlane")
                    _text(xf, _q("softwareVersion"), __version__)
                    _text(xf, _q("applicationDescription"), producer([by_engine[key]]))


def _tags(xf: etree.xmlfile, views: Sequence[PageView]) -> None:
    used = {_MARGIN_TAGS[b.kind] for v in views for b in v.blocks if b.kind in _MARGIN_TAGS}
    if any(v.estimated for v in views):
        used.add("ESTIMATED")
    if used:
        with xf.element(_q("Tags")):
            for tag_id in (tag for tag in _TAGS if tag in used):
                kind, label, description = _TAGS[tag_id]
                _leaf(xf, _q(kind), {"ID": tag_id, "LABEL": label, "DESCRIPTION": description})


def _page(xf: etree.xmlfile, view: PageView, *, processing: str) -> None:
    attrs = {"ID": f"P{view.number}", "PHYSICAL_IMG_NR": str(view.number)}
    size = {"WIDTH": str(view.width), "HEIGHT": str(view.height)} if view.width and view.height else {}
    attrs |= size
    attrs["PROCESSINGREFS"] = processing
    if view.confidence is not None:
        attrs["PC"] = confidence_text(view.confidence)
    detail = [view.note] if view.note else []
    if view.needs_review:
        detail.append("needs review" + (f": {', '.join(view.flags)}" if view.flags else ""))
    if detail:
        attrs["QUALITY_DETAIL"] = "; ".join(detail)
    with xf.element(_q("Page"), attrs), xf.element(_q("PrintSpace"), {"HPOS": "0", "VPOS": "0", **size}):
        for b, block in enumerate(view.blocks, 1):
            _block(xf, block, f"P{view.number}_B{b}", rtl=view.rtl)


def _boxed(attrs: dict[str, str], box: Box) -> dict[str, str]:
    left, top, right, bottom = box
    attrs |= {"HPOS": str(left), "VPOS": str(top), "WIDTH": str(right - left), "HEIGHT": str(bottom - top)}
    return attrs


def _block(xf: etree.xmlfile, block: BlockView, block_id: str, *, rtl: bool) -> None:
    attrs = _boxed({"ID": block_id}, block.box)
    if block.kind in _MARGIN_TAGS:
        attrs["TAGREFS"] = _MARGIN_TAGS[block.kind]
    if rtl:
        attrs["BASEDIRECTION"] = "rtl"
    if block.kind is BlockKind.TABLE:
        attrs["TYPE"] = "table"
        with xf.element(_q("ComposedBlock"), attrs):
            for c, line in enumerate(block.lines, 1):
                with xf.element(_TEXT_BLOCK, _boxed({"ID": f"{block_id}_C{c}"}, line.box)):
                    _line(xf, line, f"{block_id}_C{c}_L1")
        return
    with xf.element(_TEXT_BLOCK, attrs):
        for n, line in enumerate(block.lines, 1):
            _line(xf, line, f"{block_id}_L{n}")


def _line(xf: etree.xmlfile, line: LineView, line_id: str) -> None:
    attrs = _boxed({"ID": line_id}, line.box)
    if line.estimated:
        attrs["TAGREFS"] = "ESTIMATED"
    element = xf.element
    with element(_TEXT_LINE, attrs):
        with element(_SHAPE), element(_POLYGON, {"POINTS": points(line.quad)}):
            pass
        before_left = before_right = 0
        for w, word in enumerate(line.words, 1):  # this runs for every word: no call it can do without
            left, top, right, bottom = word.box
            if w > 1:  # the gap between two words' boxes (either order: right-to-left lines run the other way)
                low = before_right if before_right < right else right
                high = before_left if before_left > left else left
                gap = {"HPOS": str(low if low < high else high), "VPOS": str(top),
                       "WIDTH": str(high - low if high > low else 0)}
                with element(_SP, gap):
                    pass
            word_attrs = {"ID": f"{line_id}_W{w}", "CONTENT": word.text, "HPOS": str(left), "VPOS": str(top),
                          "WIDTH": str(right - left), "HEIGHT": str(bottom - top)}
            if word.confidence is not None:
                word_attrs["WC"] = confidence_text(word.confidence)
            if word.estimated:
                word_attrs["TAGREFS"] = "ESTIMATED"
            with element(_STRING, word_attrs):
                pass
            before_left, before_right = left, right


def build_page(content: Content, number: int, _spec: Format) -> bytes:
    return page_alto(content.view(number), image_name=content.image_name(number))


def build_document(content: Content, _spec: Format) -> bytes:
    return document_alto(content.views, image_name=f"{content.name}{content.ext}")
