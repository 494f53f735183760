"""Scanned PDF pages: a page whose visible content is one image, and where that image lands when rendered.

Most scanned archives are PDFs holding one full-page image per page. Rendering such a page makes
PDFium decode the image whole and resample it in software (about 75 ms for an A4 300 dpi JPEG page);
taking the image's own bytes and placing them as the render would costs what a JPEG file does.
This module answers the two questions PDFium can (preprocessing, ``workers.pdf_pages``, decodes
and places the pixels):

- ``lone_image``: is what the page shows exactly one image, and where do its pixels land in a
  render of the page at a given size (its matrix, the page's crop box and ``/Rotate`` applied, by
  PDFium's own page-to-device transform)? Only axis-aligned placements qualify (a quarter turn or a
  mirror image does; a skewed one does not). Pages with visible text, vector drawing, shadings,
  form XObjects, annotations, several images, transparency, optional content marks, or a clip that
  cuts into the image are not a lone image: they are rendered. Invisible text (render mode 3, an
  OCR layer) draws nothing and does not count.
- ``ImageDicts``: what PDFium applies when it draws an image but does not report through its API:
  ``/SMask`` and ``/Mask`` (transparency), ``/Decode`` (inverted samples), ``/OC`` (optional
  content), ``/ColorTransform`` (a JPEG's colour conversion), ``/SMaskInData``, ``/ImageMask``.
  They are read from the image's dictionary in the file's bytes, found by the last bytes of its
  stream; an image whose dictionary cannot be found (an encrypted file) counts as having them, as
  every image does in a file that has a transfer function (``/TR``) anywhere.

PDFium is not thread-safe: callers hold ``paperlane.pdfium.LOCK`` around every call here.
"""

from __future__ import annotations

import ctypes
import mmap
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pypdfium2

# The colour spaces whose samples are the picture as they are, grey or RGB (an ICC profile's subtleties aside).
_PLAIN_COLOUR = {1: "DeviceGray", 2: "DeviceRGB", 4: "CalGray", 5: "CalRGB", 7: "ICCBased"}
_PRECISION = 64  # device coordinates are read in 1/64 pixel (PDFium returns whole pixels)
_TOLERANCE = 0.5  # device pixels an edge may stray from the axis and still count as axis-aligned


@dataclass(frozen=True)
class Placement:
    """Where an image's pixels land in the rendered page: turned to the page's orientation (transposed,
    then mirrored), then scaled into ``rect`` = (left, top, right, bottom), device pixels, floats."""

    transpose: bool
    flip_x: bool
    flip_y: bool
    rect: tuple[float, float, float, float]

    def scale(self, width: int, height: int) -> float:
        """Device pixels per image pixel for a ``width`` x ``height`` image (the larger of the two axes)."""
        w, h = (height, width) if self.transpose else (width, height)
        x0, y0, x1, y1 = self.rect
        return max((x1 - x0) / w, (y1 - y0) / h)


@dataclass(frozen=True)
class LoneImage:
    """The one image a page shows: PDFium's handle (valid while its page is open), what it is, where it lands."""

    handle: Any  # FPDF_PAGEOBJECT
    width: int
    height: int
    filters: tuple[str, ...]
    components: int  # colour components of samples that are the picture as they are: 1 grey, 3 RGB; 0 others
    placement: Placement
    raw: bytes  # its stream's bytes as stored, filters not applied


def lone_image(pdf_page: pypdfium2.PdfPage, size: tuple[int, int]) -> LoneImage | None:
    """The one image ``pdf_page`` shows and where it lands in a render of ``size`` (width, height) pixels;
    None when the page shows anything else, or shows it in a way only a render reproduces."""
    import pypdfium2.raw as pdfium_c

    if pdfium_c.FPDFPage_GetAnnotCount(pdf_page) > 0:
        return None
    obj = _only_image(pdf_page)
    if obj is None or pdfium_c.FPDFPageObj_HasTransparency(obj) or _optional(obj):
        return None
    meta = pdfium_c.FPDF_IMAGEOBJ_METADATA()
    if (not pdfium_c.FPDFImageObj_GetImageMetadata(obj, pdf_page.raw, meta) or meta.width < 1 or meta.height < 1
            or meta.colorspace in (pdfium_c.FPDF_COLORSPACE_UNKNOWN, pdfium_c.FPDF_COLORSPACE_PATTERN)):
        return None  # a stencil mask (no colour space of its own: it paints the fill colour)
    placement = _placement(pdf_page, obj, size)
    if placement is None or not _clip_keeps(obj):
        return None
    plain = meta.colorspace in _PLAIN_COLOUR
    components = {8: 1, 24: 3}.get(meta.bits_per_pixel, 0) if plain else 0
    return LoneImage(handle=obj, width=meta.width, height=meta.height, filters=_filters(obj),
                     components=components, placement=placement, raw=_raw_data(obj))


def _only_image(pdf_page: pypdfium2.PdfPage) -> Any:
    """The page's one image object; None when it has none, several, or anything visible besides."""
    import pypdfium2.raw as pdfium_c

    found = None
    for i in range(pdfium_c.FPDFPage_CountObjects(pdf_page)):
        obj = pdfium_c.FPDFPage_GetObject(pdf_page, i)
        kind = pdfium_c.FPDFPageObj_GetType(obj)
        if kind == pdfium_c.FPDF_PAGEOBJ_IMAGE and found is None:
            found = obj
        elif not (kind == pdfium_c.FPDF_PAGEOBJ_TEXT
                  and pdfium_c.FPDFTextObj_GetTextRenderMode(obj) == pdfium_c.FPDF_TEXTRENDERMODE_INVISIBLE):
            return None
    return found


def _optional(obj: Any) -> bool:
    """Whether the object is marked as optional content (a viewer may hide it, and a render does)."""
    import pypdfium2.raw as pdfium_c

    name = (ctypes.c_ushort * 8)()
    length = ctypes.c_ulong()
    for i in range(pdfium_c.FPDFPageObj_CountMarks(obj)):
        mark = pdfium_c.FPDFPageObj_GetMark(obj, i)
        if not pdfium_c.FPDFPageObjMark_GetName(mark, name, ctypes.sizeof(name), length):
            return True
        if bytes(name)[: max(0, length.value - 2)].decode("utf-16-le", "replace") == "OC":
            return True
    return False


def _placement(pdf_page: pypdfium2.PdfPage, obj: Any, size: tuple[int, int]) -> Placement | None:
    """Where the image's pixels land in a ``size`` render: its unit square through its matrix to the page,
    and through PDFium's page-to-device transform (crop box, /Rotate) to the render's pixels."""
    import pypdfium2.raw as pdfium_c

    m = pdfium_c.FS_MATRIX()
    if not pdfium_c.FPDFPageObj_GetMatrix(obj, m):
        return None
    # Image pixel (0, 0) is the unit square's top-left corner (0, 1); x runs along u, y down against v.
    corner = (m.c + m.e, m.d + m.f)
    origin = _device(pdf_page, size, *corner)
    along_u = _device(pdf_page, size, m.a + m.c + m.e, m.b + m.d + m.f)
    down_v = _device(pdf_page, size, m.e, m.f)
    ex = (along_u[0] - origin[0], along_u[1] - origin[1])  # the image's x axis, across its width
    ey = (down_v[0] - origin[0], down_v[1] - origin[1])  # its y axis, down its height
    if abs(ex[1]) <= _TOLERANCE and abs(ey[0]) <= _TOLERANCE:
        transpose, flip_x, flip_y = False, ex[0] < 0, ey[1] < 0
    elif abs(ex[0]) <= _TOLERANCE and abs(ey[1]) <= _TOLERANCE:
        transpose, flip_x, flip_y = True, ey[0] < 0, ex[1] < 0  # transposed: its y axis runs across
    else:
        return None  # skewed or rotated by other than a quarter turn
    xs = (origin[0], origin[0] + ex[0] + ey[0])
    ys = (origin[1], origin[1] + ex[1] + ey[1])
    rect = (min(xs), min(ys), max(xs), max(ys))
    if rect[2] - rect[0] < 1 or rect[3] - rect[1] < 1:
        return None
    return Placement(transpose=transpose, flip_x=flip_x, flip_y=flip_y, rect=rect)


def _device(pdf_page: pypdfium2.PdfPage, size: tuple[int, int], x: float, y: float) -> tuple[float, float]:
    """Page point (x, y) in the pixels of a render of ``size``, to 1/64 pixel."""
    import pypdfium2.raw as pdfium_c

    dx, dy = ctypes.c_int(), ctypes.c_int()
    pdfium_c.FPDF_PageToDevice(pdf_page, 0, 0, size[0] * _PRECISION, size[1] * _PRECISION, 0, x, y, dx, dy)
    return dx.value / _PRECISION, dy.value / _PRECISION


def _clip_keeps(obj: Any) -> bool:
    """Whether the image's clip (if any) leaves it whole: every clip path a rectangle around its bounds."""
    import pypdfium2.raw as pdfium_c

    clip = pdfium_c.FPDFPageObj_GetClipPath(obj)
    if not clip:
        return True
    left, bottom, right, top = (ctypes.c_float() for _ in range(4))
    if not pdfium_c.FPDFPageObj_GetBounds(obj, left, bottom, right, top):
        return False
    bounds = (left.value, bottom.value, right.value, top.value)
    x, y = ctypes.c_float(), ctypes.c_float()
    for i in range(pdfium_c.FPDFClipPath_CountPaths(clip)):
        points = []
        for j in range(pdfium_c.FPDFClipPath_CountPathSegments(clip, i)):
            segment = pdfium_c.FPDFClipPath_GetPathSegment(clip, i, j)
            if pdfium_c.FPDFPathSegment_GetType(segment) == pdfium_c.FPDF_SEGMENT_BEZIERTO:
                return False
            pdfium_c.FPDFPathSegment_GetPoint(segment, x, y)
            points.append((x.value, y.value))
        if not _rectangle_around(points, bounds):
            return False
    return True


def _rectangle_around(points: list[tuple[float, float]], bounds: tuple[float, float, float, float]) -> bool:
    """Whether ``points`` (a closed path) are the corners of an axis-aligned rectangle containing ``bounds``."""
    if not points:
        return False
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, y0, x1, y1 = min(xs), min(ys), max(xs), max(ys)
    eps = 0.5  # points
    on_corners = all(min(abs(px - x0), abs(px - x1)) <= eps and min(abs(py - y0), abs(py - y1)) <= eps
                     for px, py in points)
    left, bottom, right, top = bounds
    return on_corners and x0 <= left + eps and y0 <= bottom + eps and x1 >= right - eps and y1 >= top - eps


def _filters(obj: Any) -> tuple[str, ...]:
    import pypdfium2.raw as pdfium_c

    names = []
    for i in range(pdfium_c.FPDFImageObj_GetImageFilterCount(obj)):
        n = pdfium_c.FPDFImageObj_GetImageFilter(obj, i, None, 0)
        buf = ctypes.create_string_buffer(n)
        pdfium_c.FPDFImageObj_GetImageFilter(obj, i, buf, n)
        names.append(buf.value.decode("latin-1"))
    return tuple(names)


def _raw_data(obj: Any) -> bytes:
    import pypdfium2.raw as pdfium_c

    n = pdfium_c.FPDFImageObj_GetImageDataRaw(obj, None, 0)
    buf = ctypes.create_string_buffer(n)
    pdfium_c.FPDFImageObj_GetImageDataRaw(obj, buf, n)
    return buf.raw


def image_bitmap(image: LoneImage) -> np.ndarray | None:
    """The image decoded by PDFium at its own size (its filters, /Decode and colour space applied): grey
    (one channel) or BGR; None when PDFium cannot decode it or gives it an alpha channel."""
    import pypdfium2.raw as pdfium_c

    handle = pdfium_c.FPDFImageObj_GetBitmap(image.handle)
    if not handle:
        return None
    try:
        fmt = pdfium_c.FPDFBitmap_GetFormat(handle)
        channels = {pdfium_c.FPDFBitmap_Gray: 1, pdfium_c.FPDFBitmap_BGR: 3, pdfium_c.FPDFBitmap_BGRx: 4}.get(fmt)
        if channels is None:  # BGRA (transparency) or unknown
            return None
        width, height = pdfium_c.FPDFBitmap_GetWidth(handle), pdfium_c.FPDFBitmap_GetHeight(handle)
        stride = pdfium_c.FPDFBitmap_GetStride(handle)
        buffer = (ctypes.c_ubyte * (stride * height)).from_address(
            ctypes.cast(pdfium_c.FPDFBitmap_GetBuffer(handle), ctypes.c_void_p).value or 0)
        rows = np.frombuffer(buffer, np.uint8).reshape(height, stride)
        pixels = rows[:, : width * channels].reshape(height, width, channels)
        return pixels[:, :, 0].copy() if channels == 1 else pixels[:, :, :3].copy()
    finally:
        pdfium_c.FPDFBitmap_Destroy(handle)


# In the file's bytes outside streams: an image XObject's dictionary, and a transfer function in a
# graphics state (/TR, /TR2: PDFium maps every colour drawn under it, images too).
_IMAGE_KEY = re.compile(rb"/Subtype\s*/Image\b")
_TRANSFER = re.compile(rb"/TR2?\b")
_DICT_SPAN = 16384  # bytes searched back from a stream for its object's start
_DIRECT_LENGTH = re.compile(rb"/Length\s+(\d+)\b(?!\s+\d+\s+R)")
_HIDDEN = re.compile(rb"/(?:SMask|Mask|Decode|OC|SMaskInData|ImageMask)\b")
_COLOUR_TRANSFORM = re.compile(rb"/ColorTransform\b")
_TAIL = 32  # an image stream is found by its last bytes


class ImageDicts:
    """The image dictionaries of one PDF file, indexed by the last bytes of their streams (see the
    module docstring). Built on first use from the file's bytes, in one pass (~0.5 ms per MB)."""

    def __init__(self, contents: Callable[[], bytes | mmap.mmap | list[bytes | mmap.mmap]]) -> None:
        """``contents``: the file's bytes, asked for once, when a page first needs the index; or pieces of
        it (what a reader over the object store has read so far: the objects of the page being drawn),
        asked for and indexed at every look (an image found in no piece counts as not found)."""
        self._contents: Callable[[], bytes | mmap.mmap | list[bytes | mmap.mmap]] | None = contents
        self._index: dict[bytes, tuple[bool, bool]] = {}  # tail -> (hidden entries, /ColorTransform)
        self._largest = (0, 0)

    def hidden(self, image: LoneImage) -> bool:
        """Whether PDFium draws ``image`` otherwise than its samples say (a mask, /Decode, optional content),
        or may: True also when its dictionary is not found."""
        found = self._find(image)
        return found is None or found[0]

    def colour_transform(self, image: LoneImage) -> bool:
        """Whether ``image``'s dictionary sets the JPEG colour transform itself, which a JPEG decoder
        reading the JPEG alone would not know (``/DecodeParms << /ColorTransform ... >>``); True when not found."""
        found = self._find(image)
        return found is None or found[1]

    def largest(self) -> tuple[int, int]:
        """(width, height) of the image XObject of the file that declares the most pixels (0, 0: none):
        wherever it is drawn from (a page, an annotation's appearance, a pattern, a Type 3 glyph, a soft
        mask), PDFium may decode it whole. Sizes given as indirect objects are not seen."""
        self._build()
        return self._largest

    def _build(self) -> None:
        if self._contents is None:
            return
        data = self._contents()
        if not isinstance(data, list):
            (self._index, self._largest), self._contents = _index(data), None
            return
        self._index, self._largest = {}, (0, 0)
        for piece in data:
            index, largest = _index(piece)
            self._index.update(index)
            self._largest = max(self._largest, largest, key=lambda wh: wh[0] * wh[1])

    def _find(self, image: LoneImage) -> tuple[bool, bool] | None:
        self._build()
        return self._index.get(image.raw[-_TAIL:]) if len(image.raw) >= _TAIL else None


_WIDTH = re.compile(rb"/Width\s+(\d+)\b(?!\s+\d+\s+R)")
_HEIGHT = re.compile(rb"/Height\s+(\d+)\b(?!\s+\d+\s+R)")


def _index(data: bytes | mmap.mmap) -> tuple[dict[bytes, tuple[bool, bool]], tuple[int, int]]:
    """Tail of each image stream -> (hidden entries in its dictionary, /ColorTransform in it), empty when the
    file has a transfer function (every image then counts as having hidden entries); and the (width, height)
    of the image that declares the most pixels.

    Walks the file from stream to stream, skipping each stream's data by its /Length, so that only
    the objects between them are read (a scanned PDF is nearly all image data: 20 MB are walked in
    well under a millisecond). A graphics state inside a compressed object stream is not seen.
    """
    index: dict[bytes, tuple[bool, bool]] = {}
    largest, transfer = (0, 0), False
    pos, size = 0, len(data)
    while pos < size:
        keyword = data.find(b"stream", pos)
        transfer = transfer or bool(_TRANSFER.search(data, pos, size if keyword < 0 else keyword))
        if keyword < 0:
            break
        if data[max(0, keyword - 3):keyword] == b"end":
            pos = keyword + 6
            continue
        start = data.rfind(b"obj", max(0, keyword - _DICT_SPAN), keyword)
        head = data[start:keyword] if start >= 0 else b""
        body = keyword + 6
        body += 2 if data[body:body + 2] == b"\r\n" else 1
        length = _DIRECT_LENGTH.search(head)
        end = body + int(length.group(1)) if length else _stream_end(data, body)
        if not body <= end <= size:
            pos = body  # a length that does not fit: read on from the stream's start
            continue
        if _IMAGE_KEY.search(head):
            largest = max(largest, _declared(head), key=lambda wh: wh[0] * wh[1])
            if end - body >= _TAIL:
                tail = data[end - _TAIL:end]
                hidden, transform = index.get(tail, (False, False))
                index[tail] = (hidden or bool(_HIDDEN.search(head)),
                               transform or bool(_COLOUR_TRANSFORM.search(head)))
        pos = end
    return ({} if transfer else index), largest


def _declared(head: bytes) -> tuple[int, int]:
    """(width, height) an image dictionary declares directly; (0, 0) when it does not."""
    width, height = _WIDTH.search(head), _HEIGHT.search(head)
    return (int(width.group(1)), int(height.group(1))) if width and height else (0, 0)


def _stream_end(data: bytes | mmap.mmap, body: int) -> int:
    """Where a stream whose /Length is indirect ends: before ``endstream`` and the end of line before it."""
    end = data.find(b"endstream", body)
    if end < 0:
        return -1
    for eol in (b"\r\n", b"\n", b"\r"):
        if data[max(body, end - len(eol)):end] == eol:
            return end - len(eol)
    return end
