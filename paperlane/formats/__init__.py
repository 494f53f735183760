"""Every output format of a page or a document: its file suffix, media type and files; the archive formats'
builders (ALTO, PAGE XML, hOCR, METS).

Pure functions of page results (no database, no storage): the caller reads the results and writes what comes
back, so a document's archive files can be built wherever its page results can be read. The registry names
all seven formats (suffix, media type, which forms each has); this package builds the four archive ones::

    FORMATS[OutputFormat.ALTO]        # FormatSpec(suffix=".alto.xml", media_type=..., page=True, document=True)
    page_bytes(fmt, page, *, name, page_count=1, ext=".jpg")            # ALTO, PAGE XML, hOCR of one page
    document_bytes(fmt, pages, *, document_id, name, ext=".pdf")         # ALTO, hOCR, METS of a document
    archive_files(formats, pages, *, document_id, name, ext, stem)      # every file those formats make
    file_name(name, fmt, page=None, page_count=1)  # "scan.alto.xml", "scan-p3.page.xml"

A document in ALTO or hOCR is one file holding its pages; PAGE XML holds one page a file; METS is only a
document's, and lists each page's image, ALTO and PAGE XML files, so asking for METS makes those too. A page
that did not succeed is never dropped: each format writes an empty page that says why. Each page's text and
boxes come from one view of it (``paperlane.formats.view.page_view``), made once however many formats are
written, so all of them carry the same text in the same (reading) order.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from paperlane.errors import UsageError
from paperlane.formats.alto import document_alto, page_alto
from paperlane.formats.hocr import document_hocr, page_hocr
from paperlane.formats.mets import PageFiles, document_mets
from paperlane.formats.pagexml import page_xml
from paperlane.formats.view import PageView, as_view
from paperlane.formats.xmlchars import xml_safe
from paperlane.schemas import OutputFormat, PageResult


@dataclass(frozen=True)
class FormatSpec:
    format: OutputFormat
    suffix: str  # of its files, with the dot: "scan" + ".alto.xml"
    media_type: str  # what an HTTP response carrying it says
    page: bool  # a page can be written on its own
    document: bool  # a whole document can be written as one file


FORMATS: dict[OutputFormat, FormatSpec] = {spec.format: spec for spec in (
    FormatSpec(OutputFormat.JSON, ".json", "application/json", page=True, document=True),
    FormatSpec(OutputFormat.MD, ".md", "text/markdown; charset=utf-8", page=True, document=True),
    FormatSpec(OutputFormat.PDF, ".pdf", "application/pdf", page=True, document=True),
    FormatSpec(OutputFormat.ALTO, ".alto.xml", "application/xml", page=True, document=True),
    FormatSpec(OutputFormat.PAGE, ".page.xml", "application/xml", page=True, document=False),
    FormatSpec(OutputFormat.HOCR, ".hocr", "application/xhtml+xml", page=True, document=True),
    FormatSpec(OutputFormat.METS, ".mets.xml", "application/xml", page=False, document=True),
)}
ARCHIVE_FORMATS = (OutputFormat.ALTO, OutputFormat.PAGE, OutputFormat.HOCR, OutputFormat.METS)

_IMAGE_TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".tif": "image/tiff",
                ".tiff": "image/tiff", ".webp": "image/webp", ".bmp": "image/bmp", ".gif": "image/gif",
                ".pdf": "application/pdf"}

FileKey = tuple[OutputFormat, "int | None"]  # a format's file: the document's (None) or a page's


def file_name(name: str, fmt: OutputFormat, page: int | None = None, page_count: int = 1) -> str:
    """The file a format is written to: ``name`` + suffix for a document (or its only page),
    ``name-pN`` + suffix for page N of several (the names ``paperlane run`` gives page files)."""
    suffix = FORMATS[fmt].suffix
    return f"{name}-p{page}{suffix}" if page is not None and page_count > 1 else f"{name}{suffix}"


def image_href(name: str, ext: str, page: int, page_count: int) -> str:
    """The page's image: the original file, with ``#page=N`` (RFC 8118) when it has several pages."""
    return f"{name}{ext}" + (f"#page={page}" if page_count > 1 else "")


def default_files(name: str, ext: str, pages: Sequence[int], *, image_base: str = "",
                  stem: str | None = None) -> dict[int, PageFiles]:
    """Each page's files named as ``file_name`` names them after ``stem`` (default ``name``), beside the METS;
    its image, the original ``name`` + ``ext``, under ``image_base``."""
    count, stem = len(pages), stem or name
    return {n: PageFiles(image=image_base + image_href(name, ext, n, count),
                         image_type=_IMAGE_TYPES.get(ext.lower(), "application/octet-stream"),
                         alto=file_name(stem, OutputFormat.ALTO, n, count),
                         page=file_name(stem, OutputFormat.PAGE, n, count)) for n in pages}


def page_bytes(fmt: OutputFormat, page: PageResult | PageView, *, name: str, page_count: int = 1, ext: str = "",
               created: datetime | None = None) -> bytes:
    """One page as ALTO, PAGE XML or hOCR; ``name`` and ``ext`` name the document's original (its image).

    ``created`` is PAGE XML's required time (default: now). Raises UsageError for another format.
    """
    view, name, ext = as_view(page), xml_safe(name), xml_safe(ext)
    image = image_href(name, ext, view.number, page_count)
    if fmt is OutputFormat.ALTO:
        return page_alto(view, image_name=image)
    if fmt is OutputFormat.PAGE:
        return page_xml(view, image_name=image, created=created)
    if fmt is OutputFormat.HOCR:
        return page_hocr(view, image_name=image)
    raise UsageError(f"{fmt.value} is not an archive format of a page (alto, page, hocr)")


def document_bytes(fmt: OutputFormat, pages: Sequence[PageResult | PageView], *, document_id: str, name: str,
                   ext: str = "", stem: str | None = None, files: Mapping[int, PageFiles] | None = None) -> bytes:
    """A document as one ALTO, one hOCR or its METS (``files``: each page's, default ``default_files`` with the
    page files named after ``stem``, default ``name``).

    Raises UsageError for PAGE XML (one page a file: write each page's and the METS) and other formats.
    """
    numbers = sorted(p.number if isinstance(p, PageView) else p.page for p in pages)
    document_id, name, ext, stem = xml_safe(document_id), xml_safe(name), xml_safe(ext), stem and xml_safe(stem)
    if fmt is OutputFormat.ALTO:
        return document_alto(pages, image_name=f"{name}{ext}")
    if fmt is OutputFormat.HOCR:
        return document_hocr(pages, image_names={n: image_href(name, ext, n, len(numbers)) for n in numbers})
    if fmt is OutputFormat.METS:
        return document_mets(pages, document_id=document_id, name=name,
                             files=files if files is not None else default_files(name, ext, numbers, stem=stem))
    raise UsageError(f"{fmt.value} has no whole-document archive form (alto, hocr, mets); PAGE XML holds one "
                     "page a file")


def archive_files(formats: Collection[OutputFormat], pages: Sequence[PageResult | PageView], *, document_id: str,
                  name: str, ext: str = "", stem: str | None = None,
                  created: Mapping[int, datetime] | None = None) -> dict[FileKey, bytes]:
    """Every file the archive formats among ``formats`` make of a document (the others are left out), keyed by
    format and page: the document's ALTO, hOCR and METS (page None), each page's PAGE XML, and with METS each
    page's ALTO and PAGE XML, which it lists. A document of one page has only its document's files (page None:
    ``file_name`` gives the page's file the same name). Each page's view is made once for all of them.

    ``name`` and ``ext`` name the original (the pages' image); ``stem`` (default ``name``) the files, as
    ``file_name(stem, fmt, page, len(pages))`` names them, which is how the METS refers to its page files.
    ``created``: each page's PAGE XML time (default: now).
    """
    views = sorted((as_view(p) for p in pages), key=lambda v: v.number)
    count, stem = len(views), stem or name
    several = count > 1
    files: dict[FileKey, bytes] = {}
    for fmt in (OutputFormat.ALTO, OutputFormat.HOCR):
        if fmt in formats:
            files[(fmt, None)] = document_bytes(fmt, views, document_id=document_id, name=name, ext=ext)
    per_page = {fmt for fmt in (OutputFormat.ALTO, OutputFormat.PAGE)
                if OutputFormat.METS in formats or (fmt is OutputFormat.PAGE and fmt in formats)}
    for view in views:
        page = view.number if several else None
        if OutputFormat.ALTO in per_page and (several or (OutputFormat.ALTO, None) not in files):
            files[(OutputFormat.ALTO, page)] = page_bytes(OutputFormat.ALTO, view, name=name, ext=ext,
                                                          page_count=count)
        if OutputFormat.PAGE in per_page:
            files[(OutputFormat.PAGE, page)] = page_bytes(OutputFormat.PAGE, view, name=name, ext=ext,
                                                          page_count=count, created=(created or {}).get(view.number))
    if OutputFormat.METS in formats:
        files[(OutputFormat.METS, None)] = document_bytes(OutputFormat.METS, views, document_id=document_id,
                                                          name=name, ext=ext, stem=stem)
    return files

