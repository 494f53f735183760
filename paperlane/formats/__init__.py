"""Every output format of a page or a document: its file suffix, media type and builder.

Pure functions of stored page results (no database, no storage): the caller reads the results and
writes what comes back. The archive formats (ALTO, PAGE XML, hOCR, METS) live here, below the
producer, so the API can build them from a stored result on request; JSON, markdown and the
searchable PDF are built by ``paperlane.workers.document_files`` (which also dispatches
over all seven)::

    FORMATS[OutputFormat.ALTO]        # FormatSpec(suffix=".alto.xml", media_type=..., page=True, document=True)
    page_bytes(fmt, result, *, name, page_count=1, ext=".jpg")       # ALTO, PAGE XML, hOCR of one page
    document_bytes(fmt, pages, *, document_id, name, ext=".pdf")      # ALTO, hOCR, METS of a document
    file_name(name, fmt, page=None, page_count=1)  # "scan.alto.xml", "scan-p3.page.xml" (as `paperlane run`)

PAGE XML holds one page a file (a document's are tied together by its METS); METS is only a
document's. A page that did not succeed is never dropped: each format writes an empty page that says
why. Every builder reads each page's text and boxes from ``paperlane.formats.view.page_view``, so all
of them carry the same text in the same (reading) order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from paperlane.errors import UsageError
from paperlane.formats.alto import document_alto, page_alto
from paperlane.formats.hocr import document_hocr, page_hocr
from paperlane.formats.mets import PageFiles, document_mets
from paperlane.formats.pagexml import page_xml
from paperlane.schemas import OutputFormat, PageResult

__all__ = ["FORMATS", "FormatSpec", "PageFiles", "default_files", "document_alto", "document_bytes",
           "document_hocr", "document_mets", "file_name", "image_href", "page_alto", "page_bytes", "page_hocr",
           "page_xml"]


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

_IMAGE_TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".tif": "image/tiff",
                ".tiff": "image/tiff", ".webp": "image/webp", ".bmp": "image/bmp", ".gif": "image/gif",
                ".pdf": "application/pdf"}


def file_name(name: str, fmt: OutputFormat, page: int | None = None, page_count: int = 1) -> str:
    """The file a format is written to: ``name`` + suffix for a document (or its only page),
    ``name-pN`` + suffix for page N of several (the names ``paperlane run`` gives page files)."""
    suffix = FORMATS[fmt].suffix
    return f"{name}-p{page}{suffix}" if page is not None and page_count > 1 else f"{name}{suffix}"


def image_href(name: str, ext: str, page: int, page_count: int) -> str:
    """The page's image: the original file, with ``#page=N`` (RFC 8118) when it has several pages."""
    return f"{name}{ext}" + (f"#page={page}" if page_count > 1 else "")


def default_files(name: str, ext: str, pages: Sequence[int], *, image_base: str = "") -> dict[int, PageFiles]:
    """Each page's files named as ``file_name`` names them, beside the METS; its image under ``image_base``."""
    count = len(pages)
    return {n: PageFiles(image=image_base + image_href(name, ext, n, count),
                         image_type=_IMAGE_TYPES.get(ext.lower(), "application/octet-stream"),
                         alto=file_name(name, OutputFormat.ALTO, n, count),
                         page=file_name(name, OutputFormat.PAGE, n, count)) for n in pages}


def page_bytes(fmt: OutputFormat, result: PageResult, *, name: str, page_count: int = 1, ext: str = "",
               created: datetime | None = None) -> bytes:
    """One page as ALTO, PAGE XML or hOCR; ``name`` and ``ext`` name the document's original (its image).

    ``created`` is PAGE XML's required time (default: now). Raises UsageError for another format.
    """
    image = image_href(name, ext, result.page, page_count)
    if fmt is OutputFormat.ALTO:
        return page_alto(result, image_name=image)
    if fmt is OutputFormat.PAGE:
        return page_xml(result, image_name=image, created=created)
    if fmt is OutputFormat.HOCR:
        return page_hocr(result, image_name=image)
    raise UsageError(f"{fmt.value} is not a page format here (json, md and pdf: paperlane.workers.outputs)")


def document_bytes(fmt: OutputFormat, pages: Sequence[PageResult], *, document_id: str, name: str, ext: str = "",
                   files: Mapping[int, PageFiles] | None = None) -> bytes:
    """A document as one ALTO, one hOCR or its METS (``files``: each page's, default ``default_files``).

    Raises UsageError for PAGE XML (one page a file: write each page's and the METS) and other formats.
    """
    numbers = sorted(p.page for p in pages)
    if fmt is OutputFormat.ALTO:
        return document_alto(pages, image_name=f"{name}{ext}")
    if fmt is OutputFormat.HOCR:
        return document_hocr(pages, image_names={n: image_href(name, ext, n, len(numbers)) for n in numbers})
    if fmt is OutputFormat.METS:
        return document_mets(pages, document_id=document_id, name=name,
                             files=files if files is not None else default_files(name, ext, numbers))
    raise UsageError(f"{fmt.value} has no whole-document form here; PAGE XML holds one page a file")
