"""METS for a document: its page images, ALTO and PAGE XML (and hOCR, when given) in page order.

A ``fileGrp`` per kind of file (``IMAGE``, ``FULLTEXT`` for ALTO as digital-library viewers look for
it, ``PAGEXML``, ``HOCR``), a ``file`` per page in each, and a physical ``structMap``: a
``physSequence`` holding a ``page`` div per page in page order (``ORDER``), pointing at that page's
files. A page that failed keeps its place and its files (its ALTO and PAGE say why) and its div's
``LABEL`` says so. ``metsHdr`` names paperlane, its version, the engine and the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lxml import etree

from paperlane.formats.content import Content
from paperlane.formats.registry import Format, lookup, media_type_of
from paperlane.formats.view import PageView, as_view, producer
from paperlane.schemas import OutputFormat, PageResult

NS = "http://www.loc.gov/METS/"
XLINK = "http://www.w3.org/1999/xlink"
XSI = "http://www.w3.org/2001/XMLSchema-instance"
SCHEMA_LOCATION = f"{NS} http://www.loc.gov/standards/mets/mets.xsd"


@dataclass(frozen=True)
class PageFiles:
    """Where one page's files are (hrefs, relative to the METS file or absolute URLs; None: not listed)."""

    image: str | None = None
    image_type: str = "image/jpeg"  # the image's media type
    alto: str | None = None
    page: str | None = None  # PAGE XML
    hocr: str | None = None


# (fileGrp USE, ID prefix, the PageFiles field, the format whose MIMETYPE it gives; None: the image's own)
_GROUPS = (("IMAGE", "IMG", "image", None), ("FULLTEXT", "ALTO", "alto", OutputFormat.ALTO),
           ("PAGEXML", "PAGE", "page", OutputFormat.PAGE), ("HOCR", "HOCR", "hocr", OutputFormat.HOCR))


def document_mets(pages: Sequence[PageResult | PageView], *, document_id: str, name: str,
                  files: Mapping[int, PageFiles]) -> bytes:
    """The document's METS (UTF-8): ``files`` maps each page number to its files' hrefs."""
    ordered = sorted((as_view(p) for p in pages), key=lambda v: v.number)
    root = etree.Element(f"{{{NS}}}mets", nsmap={"mets": NS, "xlink": XLINK, "xsi": XSI},
                         OBJID=document_id, LABEL=name)
    root.set(f"{{{XSI}}}schemaLocation", SCHEMA_LOCATION)
    agent = _sub(_sub(root, "metsHdr"), "agent", ROLE="CREATOR", TYPE="OTHER", OTHERTYPE="SOFTWARE")
    _sub(agent, "name").text = producer([v.engine for v in ordered])
    file_sec = _sub(root, "fileSec")
    ids: dict[int, list[str]] = {v.number: [] for v in ordered}
    for use, prefix, field, fmt in _GROUPS:
        listed = [(v.number, href) for v in ordered if (href := getattr(files.get(v.number, PageFiles()), field))]
        if not listed:
            continue
        group = _sub(file_sec, "fileGrp", USE=use)
        for number, href in listed:
            file_id = f"{prefix}_{number:05d}"
            kind = _listed_as(fmt) if fmt is not None else files[number].image_type
            _sub(_sub(group, "file", ID=file_id, MIMETYPE=kind), "FLocat", LOCTYPE="URL",
                 **{f"{{{XLINK}}}href": href})
            ids[number].append(file_id)
    sequence = _sub(_sub(root, "structMap", TYPE="PHYSICAL"), "div", TYPE="physSequence", ID="PHYS_00000")
    for view in ordered:
        attrs = {"TYPE": "page", "ID": f"PHYS_{view.number:05d}", "ORDER": str(view.number),
                 "ORDERLABEL": str(view.number)}
        if view.note:  # the page did not succeed
            attrs["LABEL"] = view.note
        div = _sub(sequence, "div", **attrs)
        for file_id in ids[view.number]:
            _sub(div, "fptr", FILEID=file_id)
    return bytes(etree.tostring(root, xml_declaration=True, encoding="UTF-8"))


def build_document(content: Content, _spec: Format) -> bytes:
    """The METS of ``content``: each page's image where the original is (``Content.original_location``), and its
    ALTO and PAGE XML where ``Content.page_file`` says (by default beside the METS, named after ``content.stem``
    as ``file_name`` names them)."""
    files = {v.number: PageFiles(image=content.original_location(v.number), image_type=media_type_of(content.ext),
                                 alto=content.page_file(OutputFormat.ALTO, v.number),
                                 page=content.page_file(OutputFormat.PAGE, v.number)) for v in content.views}
    return document_mets(content.views, document_id=content.document_id, name=content.name, files=files)


def _listed_as(fmt: OutputFormat) -> str:
    spec = lookup(fmt)
    return spec.listed_as or spec.media_type


def _sub(parent: etree._Element, tag: str, **attrs: str) -> etree._Element:
    return etree.SubElement(parent, f"{{{NS}}}{tag}", attrs)
