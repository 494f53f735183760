"""PAGE XML 2019-07-15 for one page (the format holds one page a file; METS ties a document's together).

``Page`` (the image file and its size; ``conf``: the page's confidence) with a ``ReadingOrder`` listing
its regions, a ``TextRegion`` per block in reading order (``type`` paragraph, heading, header or
footer; a table is a ``TableRegion`` holding a ``TextRegion`` a cell), each ``TextLine`` and ``Word``
with its ``Coords`` polygon and a ``TextEquiv`` (``conf``: the word's or line's confidence), and each
region's text in its own ``TextEquiv``. Boxes paperlane laid out itself carry
``custom="geometry {estimated:true;}"``. ``Metadata/Creator`` names paperlane, its version, the engine
and the model; a page without text says why in ``Metadata/Comments``, as does a page its quality grade
wants reviewed.
"""

from __future__ import annotations

from datetime import UTC, datetime

from lxml import etree

from paperlane.formats.view import BlockView, LineView, PageView, page_view, points, producer, word_confidence
from paperlane.schemas import BlockKind, PageResult

NS = "http://schema.primaresearch.org/PAGE/gts/pagecontent/2019-07-15"
XSI = "http://www.w3.org/2001/XMLSchema-instance"
SCHEMA_LOCATION = f"{NS} {NS}/pagecontent.xsd"
_ESTIMATED = "geometry {estimated:true;}"


def page_xml(result: PageResult, *, image_name: str, created: datetime | None = None) -> bytes:
    """The page's PAGE XML (UTF-8). ``image_name`` is its image file (``imageFilename``); ``created``
    (default: now) is the time PAGE's metadata requires, given so that the same call gives the same bytes."""
    view = page_view(result)
    root = etree.Element(f"{{{NS}}}PcGts", nsmap={None: NS, "xsi": XSI}, pcGtsId=f"page_{view.number}")
    root.set(f"{{{XSI}}}schemaLocation", SCHEMA_LOCATION)
    _metadata(root, result, view, created or datetime.now(UTC))
    attrs = {"imageFilename": image_name, "imageWidth": str(view.width or 0), "imageHeight": str(view.height or 0)}
    if view.rtl:
        attrs["readingDirection"] = "right-to-left"
    if view.confidence is not None:
        attrs["conf"] = _conf(view.confidence)
    page = _sub(root, "Page", **attrs)
    if view.blocks:
        order = _sub(_sub(page, "ReadingOrder"), "OrderedGroup", id=f"ro_{view.number}")
        for index in range(len(view.blocks)):
            _sub(order, "RegionRefIndexed", index=str(index), regionRef=f"r{index + 1}")
    for index, block in enumerate(view.blocks, 1):
        _region(page, block, f"r{index}", rtl=view.rtl)
    return etree.tostring(root, xml_declaration=True, encoding="UTF-8", pretty_print=True)


def _sub(parent: etree._Element, tag: str, **attrs: str) -> etree._Element:
    return etree.SubElement(parent, f"{{{NS}}}{tag}", attrs)


def _conf(value: float) -> str:
    return f"{min(max(value, 0.0), 1.0):.4g}"


def _metadata(root: etree._Element, result: PageResult, view: PageView, created: datetime) -> None:
    metadata = _sub(root, "Metadata")
    _sub(metadata, "Creator").text = producer([result.engine])
    stamp = created.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    _sub(metadata, "Created").text = stamp
    _sub(metadata, "LastChange").text = stamp
    comments = [view.note] if view.note else []
    if view.needs_review:
        comments.append("needs review" + (f": {', '.join(view.flags)}" if view.flags else ""))
    if comments:
        _sub(metadata, "Comments").text = "; ".join(comments)


def _region(parent: etree._Element, block: BlockView, region_id: str, *, rtl: bool) -> None:
    if block.kind is BlockKind.TABLE:
        table = _sub(parent, "TableRegion", id=region_id)
        _sub(table, "Coords", points=points(block.quad))
        for c, line in enumerate(block.lines, 1):
            _text_region(table, [line], f"{region_id}_c{c}", kind=None, quad=line.quad, rtl=rtl)
        return
    _text_region(parent, block.lines, region_id, kind=block.kind.value, quad=block.quad, rtl=rtl)


def _text_region(parent: etree._Element, lines: list[LineView], region_id: str, *, kind: str | None,
                 quad: list[tuple[float, float]], rtl: bool) -> None:
    attrs = {"id": region_id} | ({"type": kind} if kind else {})
    if rtl:
        attrs["readingDirection"] = "right-to-left"
    if any(line.estimated for line in lines):
        attrs["custom"] = _ESTIMATED
    region = _sub(parent, "TextRegion", **attrs)
    _sub(region, "Coords", points=points(quad))
    for n, line in enumerate(lines, 1):
        _line(region, line, f"{region_id}_l{n}")
    _sub(_sub(region, "TextEquiv"), "Unicode").text = "\n".join(line.text for line in lines)


def _line(region: etree._Element, line: LineView, line_id: str) -> None:
    element = _sub(region, "TextLine", id=line_id, **({"custom": _ESTIMATED} if line.estimated else {}))
    _sub(element, "Coords", points=points(line.quad))
    for w, word in enumerate(line.words, 1):
        attrs = {"id": f"{line_id}_w{w}"} | ({"custom": _ESTIMATED} if word.estimated else {})
        node = _sub(element, "Word", **attrs)
        _sub(node, "Coords", points=points(word.quad))
        _equiv(node, word.text, word_confidence(line, word))
    _equiv(element, line.text, line.confidence)


def _equiv(parent: etree._Element, text: str, confidence: float | None) -> None:
    equiv = _sub(parent, "TextEquiv", **({"conf": _conf(confidence)} if confidence is not None else {}))
    _sub(equiv, "Unicode").text = text
