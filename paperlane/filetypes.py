"""File types, in one place: what a file's first bytes say it is, what its name says, and what its EXIF says.

The producer decides from these whether a file is a document, an archive or neither; the worker, how to decode
a page; the document writers, how to embed an original; the annotated images, which encoding they are in. One
module, so that they agree: a PDF whose header starts a few bytes in (as PDF readers allow, within the first
1,024 bytes) is a PDF everywhere, not accepted by one and refused by the next.
"""

from __future__ import annotations

import os
import re
import struct
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL import Image

HEAD = 1024  # bytes read to tell a format: a PDF's header may start anywhere in them


class FileType(str, Enum):
    JPEG = "jpeg"
    PNG = "png"
    WEBP = "webp"
    BMP = "bmp"
    GIF = "gif"
    JP2 = "jp2"
    PNM = "pnm"
    TIFF = "tiff"
    PDF = "pdf"
    ZIP = "zip"
    TAR = "tar"  # plain, or compressed with gzip, bzip2 or xz

    @property
    def archive(self) -> bool:
        return self in (FileType.ZIP, FileType.TAR)

    @property
    def ext(self) -> str:
        """The extension a document of this format gets when its name says otherwise."""
        return _FORMAT_EXT[self]


class Compression(str, Enum):
    """How a compressed tar archive is compressed."""

    GZIP = "gzip"
    BZIP2 = "bzip2"
    XZ = "xz"


TIFF_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # classic and BigTIFF, either byte order
_COMPRESSION_MAGIC = ((b"\x1f\x8b", Compression.GZIP), (b"BZh", Compression.BZIP2), (b"\xfd7zXZ\x00", Compression.XZ))
_MAGIC: tuple[tuple[bytes, FileType], ...] = (
    (b"\xff\xd8\xff", FileType.JPEG), (b"\x89PNG\r\n\x1a\n", FileType.PNG),
    *((m, FileType.TIFF) for m in TIFF_MAGIC), (b"PK\x03\x04", FileType.ZIP), (b"PK\x05\x06", FileType.ZIP),
    (b"GIF8", FileType.GIF), *((m, FileType.TAR) for m, _ in _COMPRESSION_MAGIC),
    (b"\x00\x00\x00\x0cjP  ", FileType.JP2), (b"BM", FileType.BMP),
)
_PDF_HEADER = b"%PDF-"
_EXT_FORMAT = {
    ".jpg": FileType.JPEG, ".jpeg": FileType.JPEG, ".png": FileType.PNG, ".webp": FileType.WEBP, ".bmp": FileType.BMP,
    ".gif": FileType.GIF, ".jp2": FileType.JP2, ".pbm": FileType.PNM, ".pgm": FileType.PNM, ".ppm": FileType.PNM,
    ".tif": FileType.TIFF, ".tiff": FileType.TIFF, ".pdf": FileType.PDF, ".zip": FileType.ZIP, ".tar": FileType.TAR,
    ".tgz": FileType.TAR, ".tar.gz": FileType.TAR, ".tar.bz2": FileType.TAR, ".tar.xz": FileType.TAR,
}
_FORMAT_EXT = {FileType.JPEG: ".jpg", FileType.PNG: ".png", FileType.WEBP: ".webp", FileType.BMP: ".bmp",
               FileType.GIF: ".gif", FileType.JP2: ".jp2", FileType.PNM: ".pnm", FileType.TIFF: ".tif",
               FileType.PDF: ".pdf", FileType.ZIP: ".zip", FileType.TAR: ".tar"}
_TAR_SUFFIXES = (".tar.gz", ".tar.bz2", ".tar.xz")


def sniff(head: bytes) -> FileType | None:
    """The format the first bytes of a file say (at least its first ``HEAD`` bytes, when it has them), or None."""
    for magic, fmt in _MAGIC:
        if head.startswith(magic):
            return fmt
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return FileType.WEBP
    if _PDF_HEADER in head[:HEAD]:
        return FileType.PDF
    if head[257:262] == b"ustar":
        return FileType.TAR
    return None


def is_pdf(data: bytes) -> bool:
    """Whether ``data`` is a PDF (its header within its first ``HEAD`` bytes, as readers accept)."""
    return sniff(data[:HEAD]) is FileType.PDF


def is_tiff(data: bytes) -> bool:
    return data.startswith(TIFF_MAGIC)


def compression(head: bytes) -> Compression | None:
    """How the file whose first bytes are ``head`` is compressed (a compressed tar's), or None."""
    return next((kind for magic, kind in _COMPRESSION_MAGIC if head.startswith(magic)), None)


def split_name(name: str) -> tuple[str, str]:
    """The file name at the end of ``name`` as (stem, lower-case extension); ``.tar.gz`` and its kin are one."""
    base = re.split(r"[/\\]", name)[-1]
    low = base.lower()
    ext = next((s for s in _TAR_SUFFIXES if low.endswith(s)), None) or os.path.splitext(low)[1]
    return base[:len(base) - len(ext)], ext


def of_name(name: str) -> FileType | None:
    """The format a file's name says, or None."""
    return _EXT_FORMAT.get(split_name(name)[1])


def document_ext(name: str, fmt: FileType) -> str:
    """A document's extension: its name's when that says ``fmt``, else ``fmt``'s own."""
    ext = split_name(name)[1]
    return ext if _EXT_FORMAT.get(ext) is fmt else fmt.ext


EXIF_ORIENTATION = 0x0112


def exif_orientation(im: Image.Image) -> int:
    """The EXIF orientation (1-8) an opened image declares; 1 when it declares none or nonsense.

    A PNG's eXIf chunk counts before the pixels only (where writers put it and browsers read it): to look for
    one after them, Pillow would decode the whole image.
    """
    if im.format == "PNG" and "exif" not in im.info:
        return 1
    try:
        value = im.getexif().get(EXIF_ORIENTATION, 1)
    except (OSError, SyntaxError, ValueError, KeyError, TypeError, struct.error):  # broken EXIF: ignored
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1
