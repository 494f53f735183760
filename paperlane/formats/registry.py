"""The registry of output formats: each one's key, file extension, media type, scopes and the module that builds it.

The one table every caller looks up (the worker's outputs, ``paperlane run``, the API's ``?format=``, the CLI);
nothing else decides which formats exist, how their files are named or what media type they are served as.
A format's builder lives in ``paperlane.formats.<module>`` as ``build_page(content, number, spec)`` (page scope) and
``build_document(content, spec)`` (document scope; ``spec``: its row here, which says, for instance, which
encoding of the annotated image), imported when first built (pdfium and OpenCV load only then).

Adding a format: its module (with its builders), a row here, and a member of ``OutputFormat`` (settings and the
API validate names against it).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from paperlane.errors import UsageError
from paperlane.filetypes import HEAD, FileType, sniff
from paperlane.schemas import OutputFormat
from paperlane.settings import ImageFormat

FormatKey = OutputFormat | ImageFormat  # a document output, or the annotated image in one encoding


class Scope(str, Enum):
    PAGE = "page"  # a page can be written on its own
    DOCUMENT = "document"  # a whole document is one file


@dataclass(frozen=True)
class Format:
    key: FormatKey
    title: str  # what a person calls it: "searchable PDF", "PAGE XML"
    extension: str  # of its files, with the dot: "scan" + ".alto.xml"
    media_type: str  # what an HTTP response or a stored object carrying it says
    module: str  # paperlane.formats.<module> builds it
    scopes: frozenset[Scope]
    archive: bool = False  # built from page results alone, so the API builds it on request when not written
    best_effort: bool = False  # a document's other outputs go out without it when it cannot be made
    companions: tuple[OutputFormat, ...] = ()  # each page's file in these formats is written with it (it lists them)
    listed_as: str | None = None  # the MIMETYPE a METS file group gives it (default media_type)
    reads_original: bool = False  # built from the original too (``Content.original``), not only page results

    @property
    def page(self) -> bool:
        return Scope.PAGE in self.scopes

    @property
    def document(self) -> bool:
        return Scope.DOCUMENT in self.scopes


_PAGE, _DOCUMENT, _BOTH = frozenset({Scope.PAGE}), frozenset({Scope.DOCUMENT}), frozenset(Scope)

# Every media type paperlane names, by file extension: its outputs and the originals a METS points at.
MEDIA_TYPES = {".json": "application/json", ".md": "text/markdown; charset=utf-8", ".pdf": "application/pdf",
               ".xml": "application/xml", ".hocr": "application/xhtml+xml", ".jpg": "image/jpeg",
               ".jpeg": "image/jpeg", ".png": "image/png", ".webp": "image/webp", ".tif": "image/tiff",
               ".tiff": "image/tiff", ".bmp": "image/bmp", ".gif": "image/gif"}
UNKNOWN_MEDIA_TYPE = "application/octet-stream"

_TABLE = (
    Format(OutputFormat.JSON, "JSON", ".json", MEDIA_TYPES[".json"], "result_json", _BOTH),
    Format(OutputFormat.MD, "markdown", ".md", MEDIA_TYPES[".md"], "markdown", _BOTH),
    Format(OutputFormat.PDF, "searchable PDF", ".pdf", MEDIA_TYPES[".pdf"], "pdf", _BOTH, best_effort=True,
           reads_original=True),
    Format(OutputFormat.ALTO, "ALTO", ".alto.xml", MEDIA_TYPES[".xml"], "alto", _BOTH, archive=True,
           listed_as="application/alto+xml"),
    Format(OutputFormat.PAGE, "PAGE XML", ".page.xml", MEDIA_TYPES[".xml"], "pagexml", _PAGE, archive=True,
           listed_as="application/vnd.prima.page+xml"),
    Format(OutputFormat.HOCR, "hOCR", ".hocr", MEDIA_TYPES[".hocr"], "hocr", _BOTH, archive=True,
           listed_as="text/vnd.hocr+html"),
    Format(OutputFormat.METS, "METS", ".mets.xml", MEDIA_TYPES[".xml"], "mets", _DOCUMENT, archive=True,
           companions=(OutputFormat.ALTO, OutputFormat.PAGE)),
    *(Format(image, f"annotated image ({image.value})", f".annotated.{image.suffix}", MEDIA_TYPES[f".{image.suffix}"],
             "annotated", _PAGE) for image in ImageFormat),
)

REGISTRY: dict[FormatKey, Format] = {spec.key: spec for spec in _TABLE}
# The formats a document is written in (worker.output_formats, ``--formats``, ``?format=``).
FORMATS: dict[OutputFormat, Format] = {k: spec for k, spec in REGISTRY.items() if isinstance(k, OutputFormat)}
ARCHIVE_FORMATS = tuple(k for k, spec in FORMATS.items() if spec.archive)


def lookup(fmt: FormatKey) -> Format:
    """The registered format; UsageError for a key nothing registers."""
    try:
        return REGISTRY[fmt]
    except KeyError:
        raise UsageError(f"{fmt!r} is not a registered format") from None


def file_name(name: str, fmt: FormatKey, page: int | None = None, page_count: int = 1) -> str:
    """The file a format is written to: ``name`` + extension for a document (or its only page),
    ``name-pN`` + extension for page N of several (the names ``paperlane run`` gives page files)."""
    extension = lookup(fmt).extension
    return f"{name}-p{page}{extension}" if page is not None and page_count > 1 else f"{name}{extension}"


def media_type(fmt: FormatKey) -> str:
    return lookup(fmt).media_type


def media_type_of(ext: str) -> str:
    """The media type of a file with extension ``ext`` (``.jpg``), an original's or an output's."""
    return MEDIA_TYPES.get(ext.lower(), UNKNOWN_MEDIA_TYPE)


def names(*, scope: Scope | None = None, archive: bool | None = None) -> list[str]:
    """The document formats' names (in registry order), of ``scope`` and archive or not when given: for help
    texts and the API's query patterns."""
    return [k.value for k, spec in FORMATS.items()
            if (scope is None or scope in spec.scopes) and (archive is None or spec.archive is archive)]


_ANNOTATED_ENCODINGS = {FileType.JPEG: ImageFormat.JPEG, FileType.PNG: ImageFormat.PNG,
                        FileType.WEBP: ImageFormat.WEBP}


def format_of(data: bytes) -> ImageFormat | None:
    """The format of an encoded annotated image, from its first bytes (None: not one of ours)."""
    fmt = sniff(data[:HEAD])
    return _ANNOTATED_ENCODINGS.get(fmt) if fmt is not None else None
