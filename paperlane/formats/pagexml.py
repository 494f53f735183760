"""PAGE XML 2019-07-15 for one page (the format holds one page a file; METS ties a document's together).

``Page`` (the image file and its size; ``conf``: the page's confidence) with a ``ReadingOrder`` listing
its regions, a ``TextRegion`` per block in reading order (``type`` paragraph, heading, header or
footer; a table is a ``TableRegion`` holding a ``TextRegion`` a cell), each ``TextLine`` and ``Word``
with its ``Coords`` polygon and a ``TextEquiv`` (``conf``: the word's or line's confidence), and each
region's text in its own ``TextEquiv``. Boxes paperlane laid out itself carry
``custom="geometry {estimated:true;}"``. ``Metadata/Creator`` names paperlane, its version, the engine
and the model; a page without text says why in ``Metadata/Comments``, as does a page its quality grade
wants reviewed.

Written with lxml's incremental writer (``etree.xmlfile``): no tree is built, each element goes out as it
is made, with its attributes and text escaped by lxml.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from datetime import UTC, datetime

from lxml import etree

from paperlane.formats.content import Content
from paperlane.formats.registry import Format
from paperlane.formats.view import BlockView, LineView, PageView, as_view, confidence_text, points, producer
from paperlane.schemas import BlockKind, PageResult, Point

NS = "http://schema.primaresearch.org/PAGE/gts/pagecontent/2019-07-15"
XSI = "http://www.w3.org/2001/XMLSchema-instance"
SCHEMA_LOCATION = f"{NS} {NS}/pagecontent.xsd"
_NSMAP = {None: NS, "xsi": XSI}
_ESTIMATED = "geometry {estimated:true;}"


def _q(tag: str) -> str:
    return f"{{{NS}}}{tag}"


# The tags written once per line or word, qualified once.
_TEXT_REGION, _TEXT_LINE, _WORD, _COORDS, _TEXT_EQUIV, _UNICODE = map(
    _q, ("TextRegion", "TextLine", "Word", "Coords", "TextEquiv", "Unicode"))


def page_xml(page: PageResult | PageView, *, image_name: str, created: datetime | None = None) -> bytes:
    """The page's PAGE XML (UTF-8). ``image_name`` is its image file (``imageFilename``); ``created``
    (default: now) is the time PAGE's metadata requires, given so that the same call gives the same bytes."""
    view = as_view(page)
    attrs = {"imageFilename": image_name, "imageWidth": str(view.width or 0), "imageHeight": str(view.height or 0)}
    if view.rtl:
        attrs["readingDirection"] = "right-to-left"
    if view.confidence is not None:
        attrs["conf"] = confidence_text(view.confidence)
    out = io.BytesIO()
    with etree.xmlfile(out, encoding="UTF-8") as xf:
        xf.write_declaration()
        with xf.element(_q("PcGts"), {"pcGtsId": f"page_{view.number}", f"{{{XSI}}}schemaLocation": SCHEMA_LOCATION},
                        nsmap=_NSMAP):
            _metadata(xf, view, created or datetime.now(UTC))
            with xf.element(_q("Page"), attrs):
                if view.blocks:
                    _reading_order(xf, view)
                for index, block in enumerate(view.blocks, 1):
                    _region(xf, block, f"r{index}", rtl=view.rtl)
    return out.getvalue()


def _reading_order(xf: etree.xmlfile, view: PageView) -> None:
    with xf.element(_q("ReadingOrder")), xf.element(_q("OrderedGroup"), {"id": f"ro_{view.number}"}):
        for index in range(len(view.blocks)):
            with xf.element(_q("RegionRefIndexed"), {"index": str(index), "regionRef": f"r{index + 1}"}):
                pass


def _text(xf: etree.xmlfile, tag: str, text: str) -> None:
    with xf.element(tag):
        xf.write(text)


def _metadata(xf: etree.xmlfile, view: PageView, created: datetime) -> None:
    stamp = created.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    comments = [view.note] if view.note else []
    if view.needs_review:
        comments.append("needs review" + (f": {', '.join(view.flags)}" if view.flags else ""))
    with xf.element(_q("Metadata")):
        _text(xf, _q("Creator"), producer([view.engine]))
        _text(xf, _q("Created"), stamp)
        _text(xf, _q("LastChange"), stamp)
        if comments:
            _text(xf, _q("Comments"), "; ".join(comments))


def _region(xf: etree.xmlfile, block: BlockView, region_id: str, *, rtl: bool) -> None:
    if block.kind is BlockKind.TABLE:
        with xf.element(_q("TableRegion"), {"id": region_id}):
            _coords(xf, block.quad)
            for c, line in enumerate(block.lines, 1):
                _text_region(xf, [line], f"{region_id}_c{c}", kind=None, quad=line.quad, rtl=rtl)
        return
    _text_region(xf, block.lines, region_id, kind=block.kind.value, quad=block.quad, rtl=rtl)


def _coords(xf: etree.xmlfile, quad: Sequence[Point]) -> None:
    with xf.element(_COORDS, {"points": points(quad)}):
        pass


def _text_region(xf: etree.xmlfile, lines: list[LineView], region_id: str, *, kind: str | None,
                 quad: Sequence[Point], rtl: bool) -> None:
    attrs = {"id": region_id} | ({"type": kind} if kind else {})
    if rtl:
        attrs["readingDirection"] = "right-to-left"
    if any(line.estimated for line in lines):
        attrs["custom"] = _ESTIMATED
    with xf.element(_TEXT_REGION, attrs):
        _coords(xf, quad)
        for n, line in enumerate(lines, 1):
            _line(xf, line, f"{region_id}_l{n}")
        with xf.element(_TEXT_EQUIV):
            _text(xf, _UNICODE, "\n".join(line.text for line in lines))


def _line(xf: etree.xmlfile, line: LineView, line_id: str) -> None:
    element, write = xf.element, xf.write
    with element(_TEXT_LINE, {"id": line_id, "custom": _ESTIMATED} if line.estimated else {"id": line_id}):
        _coords(xf, line.quad)
        for w, word in enumerate(line.words, 1):  # this runs for every word: no call it can do without
            word_id = f"{line_id}_w{w}"
            with element(_WORD, {"id": word_id, "custom": _ESTIMATED} if word.estimated else {"id": word_id}):
                with element(_COORDS, {"points": points(word.quad)}):
                    pass
                conf = {"conf": confidence_text(word.confidence)} if word.confidence is not None else {}
                with element(_TEXT_EQUIV, conf), element(_UNICODE):
                    write(word.text)
        _equiv(xf, line.text, line.confidence)


def _equiv(xf: etree.xmlfile, text: str, confidence: float | None) -> None:
    with xf.element(_TEXT_EQUIV, {"conf": confidence_text(confidence)} if confidence is not None else {}):
        _text(xf, _UNICODE, text)


def build_page(content: Content, number: int, _spec: Format) -> bytes:
    return page_xml(content.view(number), image_name=content.image_name(number), created=content.created.get(number))
