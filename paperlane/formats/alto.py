"""ALTO 4.4 XML for a page or a whole document (one ``Page`` per page, in page order).

Each page: ``Page`` (the image's size in pixels, ``PC``: the page's confidence) holding a
``PrintSpace`` with a ``TextBlock`` per block in reading order (a table is a ``ComposedBlock`` of
``TYPE="table"`` with a block a cell), each ``TextLine`` with its box, a polygon ``Shape`` from its
quad and its words as ``String``s (``WC``: the word's confidence, else its line's) with ``SP`` between.
An explicit ``ReadingOrder`` lists the blocks. ``Description/Processing`` names paperlane, its version,
the engine and the model. Boxes paperlane laid out itself (words along a line, text without geometry)
carry ``TAGREFS`` to the ``OtherTag`` ``ESTIMATED``; header and footer blocks to the ``LayoutTag``s
``HEADER`` and ``FOOTER``. A page without text says why in ``QUALITY_DETAIL`` (``page 3 failed: ...``),
as does a page its quality grade wants reviewed (``needs review: flags``).
"""

from __future__ import annotations

from collections.abc import Sequence

from lxml import etree

from paperlane.formats.view import (
    BlockView,
    LineView,
    PageView,
    page_view,
    pixel_box,
    points,
    producer,
    word_confidence,
)
from paperlane.schemas import BlockKind, PageResult

NS = "http://www.loc.gov/standards/alto/ns-v4#"
XLINK = "http://www.w3.org/1999/xlink"
XSI = "http://www.w3.org/2001/XMLSchema-instance"
SCHEMA_LOCATION = f"{NS} http://www.loc.gov/alto/v4/alto-4-4.xsd"
_TAGS = {"ESTIMATED": ("OtherTag", "estimated geometry",
                       "laid out by paperlane, not read from the page: words along their line by character "
                       "widths, or text without boxes stacked from the top of the page"),
         "HEADER": ("LayoutTag", "header", "a running head in the top margin"),
         "FOOTER": ("LayoutTag", "footer", "a running foot or page number in the bottom margin")}
_MARGIN_TAGS = {BlockKind.HEADER: "HEADER", BlockKind.FOOTER: "FOOTER"}


def page_alto(result: PageResult, *, image_name: str) -> bytes:
    """The page's ALTO (UTF-8); ``image_name`` is its image file, as ``sourceImageInformation`` names it."""
    return document_alto([result], image_name=image_name)


def document_alto(pages: Sequence[PageResult], *, image_name: str) -> bytes:
    """One ALTO holding every page of a document in page order (``image_name``: the document's file)."""
    ordered = sorted(pages, key=lambda p: p.page)
    views = [page_view(p) for p in ordered]
    root = etree.Element(f"{{{NS}}}alto", nsmap={None: NS, "xlink": XLINK, "xsi": XSI}, SCHEMAVERSION="4.4")
    root.set(f"{{{XSI}}}schemaLocation", SCHEMA_LOCATION)
    _description(root, image_name, ordered)
    used = _used_tags(views)
    if used:
        tags = _sub(root, "Tags")
        for tag_id in used:
            kind, label, description = _TAGS[tag_id]
            _sub(tags, kind, ID=tag_id, LABEL=label, DESCRIPTION=description)
    if any(v.blocks for v in views):
        order = _sub(_sub(root, "ReadingOrder"), "OrderedGroup", ID="RO")
        for v in views:
            for b, _ in enumerate(v.blocks, 1):
                _sub(order, "ElementRef", ID=f"RO_P{v.number}_B{b}", REF=f"P{v.number}_B{b}")
    layout = _sub(root, "Layout")
    engines = _engine_ids(ordered)
    for result, view in zip(ordered, views):
        _page(layout, view, processing=engines.get(_engine_key(result)))
    return etree.tostring(root, xml_declaration=True, encoding="UTF-8", pretty_print=True)


def _sub(parent: etree._Element, tag: str, **attrs: str) -> etree._Element:
    return etree.SubElement(parent, f"{{{NS}}}{tag}", attrs)


def _engine_key(result: PageResult) -> str | None:
    return result.engine.model_dump_json() if result.engine else None


def _engine_ids(pages: Sequence[PageResult]) -> dict[str | None, str]:
    keys = list(dict.fromkeys(_engine_key(p) for p in pages))
    return {key: f"OCR_{k}" for k, key in enumerate(keys)}


def _description(root: etree._Element, image_name: str, pages: Sequence[PageResult]) -> None:
    description = _sub(root, "Description")
    _sub(description, "MeasurementUnit").text = "pixel"
    _sub(_sub(description, "sourceImageInformation"), "fileName").text = image_name
    from paperlane import __version__

    by_engine = {_engine_key(p): p.engine for p in pages}
    for key, processing_id in _engine_ids(pages).items():
        step = _sub(description, "Processing", ID=processing_id)
        _sub(step, "processingCategory").text = "contentGeneration"
        _sub(step, "processingStepDescription").text = (
            "text recognition; blocks and reading order from line geometry (recursive XY-cut)")
        software = _sub(step, "processingSoftware")
        _sub(software, "softwareCreator").text = "paperlane"
        _sub(software, "softwareName").text = "paperlane"
        _sub(software, "softwareVersion").text = __version__
        _sub(software, "applicationDescription").text = producer([by_engine[key]])


def _used_tags(views: Sequence[PageView]) -> list[str]:
    used = set()
    for view in views:
        for block in view.blocks:
            if block.kind in _MARGIN_TAGS:
                used.add(_MARGIN_TAGS[block.kind])
            if any(ln.estimated or any(w.estimated for w in ln.words) for ln in block.lines):
                used.add("ESTIMATED")
    return [tag for tag in _TAGS if tag in used]


def _page(layout: etree._Element, view: PageView, *, processing: str | None) -> None:
    attrs = {"ID": f"P{view.number}", "PHYSICAL_IMG_NR": str(view.number)}
    if view.width and view.height:
        attrs |= {"WIDTH": str(view.width), "HEIGHT": str(view.height)}
    if processing:
        attrs["PROCESSINGREFS"] = processing
    if view.confidence is not None:
        attrs["PC"] = f"{min(max(view.confidence, 0.0), 1.0):.4g}"
    detail = [view.note] if view.note else []
    if view.needs_review:
        detail.append("needs review" + (f": {', '.join(view.flags)}" if view.flags else ""))
    if detail:
        attrs["QUALITY_DETAIL"] = "; ".join(detail)
    page = _sub(layout, "Page", **attrs)
    space = _sub(page, "PrintSpace", HPOS="0", VPOS="0")
    if view.width and view.height:
        space.set("WIDTH", str(view.width))
        space.set("HEIGHT", str(view.height))
    for b, block in enumerate(view.blocks, 1):
        _block(space, block, f"P{view.number}_B{b}", rtl=view.rtl)


def _box(attrs: dict[str, str], quad: Sequence[tuple[float, float]]) -> dict[str, str]:
    left, top, width, height = pixel_box(quad)
    return attrs | {"HPOS": str(left), "VPOS": str(top), "WIDTH": str(width), "HEIGHT": str(height)}


def _block(parent: etree._Element, block: BlockView, block_id: str, *, rtl: bool) -> None:
    attrs = _box({"ID": block_id}, block.quad)
    if block.kind in _MARGIN_TAGS:
        attrs["TAGREFS"] = _MARGIN_TAGS[block.kind]
    if rtl:
        attrs["BASEDIRECTION"] = "rtl"
    if block.kind is BlockKind.TABLE:
        table = _sub(parent, "ComposedBlock", **attrs, TYPE="table")
        for c, line in enumerate(block.lines, 1):
            cell = _sub(table, "TextBlock", **_box({"ID": f"{block_id}_C{c}"}, line.quad))
            _line(cell, line, f"{block_id}_C{c}_L1")
        return
    text_block = _sub(parent, "TextBlock", **attrs)
    for n, line in enumerate(block.lines, 1):
        _line(text_block, line, f"{block_id}_L{n}")


def _line(parent: etree._Element, line: LineView, line_id: str) -> None:
    attrs = _box({"ID": line_id}, line.quad)
    if line.estimated:
        attrs["TAGREFS"] = "ESTIMATED"
    element = _sub(parent, "TextLine", **attrs)
    _sub(_sub(element, "Shape"), "Polygon", POINTS=points(line.quad))
    for w, word in enumerate(line.words, 1):
        if w > 1:
            _space(element, pixel_box(line.words[w - 2].quad), pixel_box(word.quad))
        word_attrs = _box({"ID": f"{line_id}_W{w}", "CONTENT": word.text}, word.quad)
        confidence = word_confidence(line, word)
        if confidence is not None:
            word_attrs["WC"] = f"{min(max(confidence, 0.0), 1.0):.4g}"
        if word.estimated:
            word_attrs["TAGREFS"] = "ESTIMATED"
        _sub(element, "String", **word_attrs)


def _space(line: etree._Element, a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> None:
    """The ``SP`` between two words' boxes (either order: right-to-left lines run the other way)."""
    low, high = min(a[0] + a[2], b[0] + b[2]), max(a[0], b[0])
    _sub(line, "SP", HPOS=str(min(low, high)), VPOS=str(b[1]), WIDTH=str(max(0, high - low)))
