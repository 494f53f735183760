"""What every format is built from: a document's page results (or one page's) and the names of its original.

One value for every format, so ``paperlane.formats.build`` has one signature whatever it builds: the archive
formats read each page's view (made once, however many formats are written), JSON, markdown and the searchable
PDF read the results, the searchable PDF the original's bytes (read only when it is built), the annotated image
the page's preview.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from paperlane.errors import UsageError
from paperlane.formats.registry import file_name
from paperlane.schemas import OutputFormat, PageResult

if TYPE_CHECKING:
    from paperlane.formats.view import PageView


_Page = TypeVar("_Page")


def _no_original() -> bytes | None:
    return None


@dataclass(frozen=True)
class Content:
    """A document (or some of its pages) as the formats take it.

    ``name`` and ``ext`` name the original (``scan`` + ``.pdf``): the image ALTO, PAGE XML and hOCR name.
    ``stem`` (default ``name``) names the files, as ``file_name(stem, fmt, page, page_count)`` does: how a METS
    refers to the page files beside it. ``original_href`` is where the original is, for a METS's image group
    (default ``name + ext``, beside it); a page of several gets ``#page=N`` (RFC 8118), or ``&page=N`` when the
    href has a fragment already. ``page_count`` is the whole document's (default: the pages given), for a page
    built alone. ``created``: each page's PAGE XML time (default: now).
    """

    pages: Sequence[PageResult | PageView]
    name: str = "document"
    ext: str = ""
    document_id: str = ""
    source: str = ""
    stem: str | None = None
    page_count: int | None = None
    original: Callable[[], bytes | None] = _no_original  # read when a format needs it (the searchable PDF)
    original_href: str | None = None
    created: Mapping[int, datetime] = field(default_factory=dict)
    max_pixels: int = 150_000_000  # an image frame larger than this is not decoded (its PDF page is blank)
    preview: Any = None  # the annotated image's canvas: the page's preview (numpy) from preprocessing
    # Where page N's file in a format is, for a METS: default ``file_name(stem, fmt, N, count)``, beside it.
    page_file_href: Callable[[OutputFormat, int], str] | None = None

    @property
    def count(self) -> int:
        return self.page_count if self.page_count is not None else len(self.pages)

    @property
    def file_stem(self) -> str:
        return self.stem or self.name

    @cached_property
    def views(self) -> list[PageView]:
        """Each page's view, in page order (made once)."""
        from paperlane.formats.view import as_view  # the layout code loads with the first archive format built

        return sorted((as_view(p) for p in self.pages), key=lambda v: v.number)

    @cached_property
    def results(self) -> list[PageResult]:
        """The page results in page order; UsageError when only views were given (JSON, markdown and the PDF
        need the results themselves)."""
        if not all(isinstance(p, PageResult) for p in self.pages):
            raise UsageError("this format is built from page results, not their views")
        return sorted((p for p in self.pages if isinstance(p, PageResult)), key=lambda p: p.page)

    def view(self, number: int) -> PageView:
        return _numbered(self.views, number, lambda v: v.number)

    def result(self, number: int) -> PageResult:
        return _numbered(self.results, number, lambda r: r.page)

    def image_name(self, number: int) -> str:
        """The page's image as ALTO, PAGE XML and hOCR name it: the original's name, with ``#page=N`` when the
        document has several pages."""
        return f"{self.name}{self.ext}" + (f"#page={number}" if self.count > 1 else "")

    def page_file(self, fmt: OutputFormat, number: int) -> str:
        """Where page ``number``'s file in ``fmt`` is, as a METS lists it (see ``page_file_href``)."""
        if self.page_file_href is not None:
            return self.page_file_href(fmt, number)
        return file_name(self.file_stem, fmt, number, self.count)

    def original_location(self, number: int) -> str:
        """Where page ``number``'s image is, for a METS (see the class docstring)."""
        href = self.original_href if self.original_href is not None else f"{self.name}{self.ext}"
        if self.count <= 1:
            return href
        return href + ("&" if "#" in href else "#") + f"page={number}"


def _numbered(items: Sequence[_Page], number: int, key: Callable[[_Page], int]) -> _Page:
    found = next((item for item in items if key(item) == number), None)
    if found is None:
        raise UsageError(f"no page {number} among the pages given")
    return found
