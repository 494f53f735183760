"""PDFs whose rendering costs far more than their size says, written by hand (one page each, a few kB).

Each hides a huge image where the walk over a page's objects does not look (an annotation's
appearance, a tiling pattern, a Type 3 glyph, an image's soft mask), or costs time or memory in ways
no declared size shows: what the render limits (``worker.render_memory_bytes``, ``worker.render_timeout``)
are for.
"""

from __future__ import annotations

import zlib

from tests.test_preprocess import ONE_PAGE, handmade_pdf

# The pages of tests/test_preprocess.py's handmade PDFs: catalog 1, pages 2, the page 3, its content 4.

PAGE = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Contents 4 0 R /Resources %s %s >>"


def _stream(dictionary: bytes, data: bytes) -> bytes:
    return b"<< %s /Length %d >>\nstream\n%s\nendstream" % (dictionary, len(data), data)


def huge_image(side: int = 40000, *, data: bytes = b"\x00\x00\x00\x00", flate: bool = False) -> bytes:
    """An image XObject that declares ``side`` x ``side`` grey pixels (its samples ``data``)."""
    filters = b"/Filter /FlateDecode " if flate else b""
    return _stream(b"/Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceGray "
                   b"/BitsPerComponent 8 %s" % (side, side, filters), data)


def _one_page(resources: bytes, content: bytes, *more: bytes, extra: bytes = b"") -> bytes:
    """Objects: 1 catalog, 2 pages, 3 the page, 4 its content, then ``more`` from 5."""
    return handmade_pdf(*ONE_PAGE, PAGE % (resources, extra), _stream(b"", content), *more)


def annotation_bomb(side: int = 40000) -> bytes:
    """An annotation whose appearance draws a huge image over the page."""
    draw = b"q 595 0 0 842 0 0 cm /Im1 Do Q"
    appearance = _stream(b"/Type /XObject /Subtype /Form /BBox [0 0 595 842] "
                         b"/Resources << /XObject << /Im1 6 0 R >> >>", draw)
    annot = b"[<< /Type /Annot /Subtype /Square /Rect [0 0 595 842] /F 4 /AP << /N 5 0 R >> >>]"
    return _one_page(b"<< >>", b"", appearance, huge_image(side), extra=b"/Annots " + annot)


def pattern_bomb(side: int = 40000) -> bytes:
    """A tiling pattern whose cell draws a huge image, filling the page."""
    cell = _stream(b"/Type /Pattern /PatternType 1 /PaintType 1 /TilingType 1 /BBox [0 0 595 842] /XStep 595 "
                   b"/YStep 842 /Resources << /XObject << /Im1 6 0 R >> >>", b"q 595 0 0 842 0 0 cm /Im1 Do Q")
    return _one_page(b"<< /Pattern << /P1 5 0 R >> >>", b"/Pattern cs /P1 scn 0 0 595 842 re f", cell,
                     huge_image(side))


def type3_bomb(side: int = 40000) -> bytes:
    """A Type 3 font whose glyph draws a huge image, and a page that shows that glyph."""
    glyph = _stream(b"", b"1000 0 0 0 1000 1000 d1 q 1000 0 0 1000 0 0 cm /Im1 Do Q")
    font = (b"<< /Type /Font /Subtype /Type3 /FontBBox [0 0 1000 1000] /FontMatrix [0.001 0 0 0.001 0 0] "
            b"/CharProcs << /a 6 0 R >> /Encoding << /Type /Encoding /Differences [97 /a] >> /FirstChar 97 "
            b"/LastChar 97 /Widths [1000] /Resources << /XObject << /Im1 7 0 R >> >> >>")
    return _one_page(b"<< /Font << /F1 5 0 R >> >>", b"BT /F1 500 Tf 50 300 Td (a) Tj ET", font, glyph,
                     huge_image(side))


def soft_mask_bomb(side: int = 40000) -> bytes:
    """A small image whose soft mask declares a huge size (PDFium decodes the mask at its own size)."""
    small = _stream(b"/Type /XObject /Subtype /Image /Width 2 /Height 2 /ColorSpace /DeviceGray "
                    b"/BitsPerComponent 8 /SMask 6 0 R", b"\x80\x80\x80\x80")
    return _one_page(b"<< /XObject << /Im1 5 0 R >> >>", b"q 595 0 0 842 0 0 cm /Im1 Do Q", small,
                     huge_image(side))


def inflating_image(side: int = 20000) -> bytes:
    """A page drawing one real ``side`` x ``side`` grey image, Flate-compressed (a few hundred kB for 400 MP):
    under ``max_image_pixels`` when that is raised, it costs its whole size in memory to render."""
    deflate = zlib.compressobj(9)
    row = bytes(side)
    chunks = [deflate.compress(row * 500) for _ in range(side // 500)]
    data = b"".join(chunks) + deflate.flush()
    return _one_page(b"<< /XObject << /Im1 5 0 R >> >>", b"q 595 0 0 842 0 0 cm /Im1 Do Q",
                     huge_image(side, data=data, flate=True))


def slow_page(levels: int = 22) -> bytes:
    """Forms that each draw the one below twice, ``levels`` deep: 2**levels rectangles from a few hundred bytes,
    no image at all (PDFium parses and draws every one of them)."""
    forms = []
    first = 5
    for level in range(levels):
        number = first + level
        if level == 0:
            body = b"0 0 1 1 re f"
            resources = b""
        else:
            body = b"/F Do 0.5 0 0 0.5 1 1 cm /F Do"
            resources = b"/Resources << /XObject << /F %d 0 R >> >>" % (number - 1)
        forms.append(_stream(b"/Type /XObject /Subtype /Form /BBox [0 0 595 842] %s" % resources, body))
    top = first + levels - 1
    return _one_page(b"<< /XObject << /F %d 0 R >> >>" % top, b"/F Do", *forms)


def tiling_bomb(step: float = 0.05) -> bytes:
    """A tiling pattern of ``step``-point cells filling the page: millions of cells, each drawn (seconds of
    CPU per page from a few hundred bytes, and little memory)."""
    cell = _stream(b"/Type /Pattern /PatternType 1 /PaintType 1 /TilingType 1 /BBox [0 0 1 1] /XStep %g "
                   b"/YStep %g /Resources << >>" % (step, step), b"0 0 0.5 0.5 re f")
    return _one_page(b"<< /Pattern << /P1 5 0 R >> >>", b"/Pattern cs /P1 scn 0 0 595 842 re f", cell)
