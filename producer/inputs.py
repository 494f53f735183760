"""Turn what a user points at into pages: images, PDFs, TIFFs, folders, zip and tar archives.

Pages come out lazily, one at a time, so a 5,000-page PDF or a huge archive never sits in
memory whole. Image files pass through byte for byte (the worker decodes them, and an unreadable
one fails as its own job); PDF pages are rendered and multi-page TIFFs split here, and a file
that cannot even be opened yields one page carrying its ``InputError``.
"""

from __future__ import annotations

import io
import logging
import tarfile
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path, PurePosixPath

from paperlane.errors import InputError, UsageError

log = logging.getLogger(__name__)

IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".jp2", ".pbm", ".pgm", ".ppm"}
TIFF_EXTS = {".tif", ".tiff"}
PDF_EXTS = {".pdf"}
ZIP_EXTS = {".zip"}
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
PAGE_EXTS = IMAGE_EXTS | TIFF_EXTS | PDF_EXTS

PDF_DPI = 200


@dataclass
class PageInput:
    """One page to process. ``name`` is the output stem: the file's stem, plus -pN when multi-page."""

    source: str
    name: str
    page: int
    data: bytes
    ext: str
    error: InputError | None = None


def expand(paths: Iterable[str | Path]) -> Iterator[PageInput]:
    """Every page under ``paths``, in a stable order. Raises UsageError for a path that does not exist."""
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for child in sorted(p for p in path.rglob("*") if p.is_file() and not _hidden(p.relative_to(path))):
                if _kind(child.name) is not None:
                    yield from _from_file(child.name, str(child), child.read_bytes)
        elif path.is_file():
            yield from _from_file(path.name, str(path), path.read_bytes, explicit=True)
        else:
            raise UsageError(f"no such file or folder: {raw}")


def _hidden(rel: Path | PurePosixPath) -> bool:
    return any(part.startswith(".") or part == "__MACOSX" for part in rel.parts)


def _kind(name: str) -> str | None:
    low = name.lower()
    if low.endswith(TAR_SUFFIXES):
        return "tar"
    ext = PurePosixPath(low).suffix
    if ext in ZIP_EXTS:
        return "zip"
    if ext in PDF_EXTS:
        return "pdf"
    if ext in TIFF_EXTS:
        return "tiff"
    if ext in IMAGE_EXTS:
        return "image"
    return None


def _from_file(name: str, source: str, read: Callable[[], bytes], *, explicit: bool = False) -> Iterator[PageInput]:
    kind = _kind(name) or ("image" if explicit else None)
    stem, ext = PurePosixPath(name).stem, PurePosixPath(name).suffix.lower()
    if kind == "image":
        yield PageInput(source=source, name=stem, page=1, data=read(), ext=ext)
    elif kind == "pdf":
        yield from _pdf_pages(source, stem, read())
    elif kind == "tiff":
        yield from _tiff_pages(source, stem, read(), ext)
    elif kind == "zip":
        yield from _zip_members(source, read())
    elif kind == "tar":
        yield from _tar_members(source, read())


def _paged(stem: str, count: int, page: int) -> str:
    return stem if count == 1 else f"{stem}-p{page}"


def _pdf_pages(source: str, stem: str, data: bytes) -> Iterator[PageInput]:
    import pypdfium2 as pdfium

    try:
        pdf = pdfium.PdfDocument(data)
    except pdfium.PdfiumError as exc:
        yield PageInput(source, stem, 1, data, ".pdf", InputError(f"unreadable PDF ({exc})", stage="upload"))
        return
    try:
        count = len(pdf)
        if count == 0:
            yield PageInput(source, stem, 1, data, ".pdf", InputError("PDF has no pages", stage="upload"))
        for i in range(count):
            name = _paged(stem, count, i + 1)
            try:
                bitmap = pdf[i].render(scale=PDF_DPI / 72)
                buf = io.BytesIO()
                bitmap.to_pil().save(buf, format="PNG", compress_level=1)
                yield PageInput(source, name, i + 1, buf.getvalue(), ".png")
            except pdfium.PdfiumError as exc:
                yield PageInput(source, name, i + 1, b"", ".pdf",
                                InputError(f"cannot render PDF page {i + 1} ({exc})", stage="upload"))
    finally:
        pdf.close()


def _tiff_pages(source: str, stem: str, data: bytes, ext: str) -> Iterator[PageInput]:
    from PIL import Image, ImageSequence

    try:
        with Image.open(io.BytesIO(data)) as im:
            count = getattr(im, "n_frames", 1)
            if count == 1:  # pass through untouched; the worker decodes it
                yield PageInput(source, stem, 1, data, ext)
                return
            for i, frame in enumerate(ImageSequence.Iterator(im)):
                buf = io.BytesIO()
                frame.save(buf, format="PNG", compress_level=1)
                yield PageInput(source, _paged(stem, count, i + 1), i + 1, buf.getvalue(), ".png")
    except (OSError, SyntaxError, ValueError) as exc:
        log.debug("TIFF %s not splittable: %s", source, exc)
        yield PageInput(source, stem, 1, data, ext)  # the worker reports what is wrong with it


def _zip_members(source: str, data: bytes) -> Iterator[PageInput]:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        yield PageInput(source, PurePosixPath(source).stem, 1, data, ".zip",
                        InputError("unreadable zip archive", stage="upload"))
        return
    with archive:
        for info in sorted(archive.infolist(), key=lambda i: i.filename):
            member = PurePosixPath(info.filename)
            if info.is_dir() or _hidden(member) or _kind(member.name) is None:
                continue
            yield from _from_file(member.name, f"{source}!{info.filename}", partial(archive.read, info))


def _tar_read(archive: tarfile.TarFile, info: tarfile.TarInfo) -> bytes:
    fh = archive.extractfile(info)
    return fh.read() if fh is not None else b""


def _tar_members(source: str, data: bytes) -> Iterator[PageInput]:
    try:
        archive = tarfile.open(fileobj=io.BytesIO(data))
    except tarfile.TarError:
        yield PageInput(source, PurePosixPath(source).name.split(".")[0], 1, data, ".tar",
                        InputError("unreadable tar archive", stage="upload"))
        return
    with archive:
        for info in sorted(archive.getmembers(), key=lambda i: i.name):
            member = PurePosixPath(info.name)
            if not info.isfile() or _hidden(member) or _kind(member.name) is None:
                continue
            yield from _from_file(member.name, f"{source}!{info.name}", partial(_tar_read, archive, info))
