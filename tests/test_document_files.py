"""Document outputs: the searchable PDF's text layer read back with pdfium where the lines are, the
pages it keeps and the failures it marks; the markdown and the document JSON."""

from __future__ import annotations

import ctypes
import io
import json
import math
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
import pytest
from PIL import Image, ImageDraw

from paperlane.schemas import JobStatus, Line, PageResult, Point, Task
from paperlane.formats.markdown import document_markdown
from paperlane.formats.pdf import searchable_pdf
from paperlane.formats.result_json import document_json

Box = tuple[float, float, float, float]  # left, bottom, right, top in PDF points


def _quad(x: float, y: float, w: float, h: float) -> list[Point]:
    return [(x, y), (x + w, y), (x + w, y + h), (x, y + h)]


def _turned(cx: float, cy: float, w: float, h: float, degrees: float) -> list[Point]:
    """A w x h quad about (cx, cy) in image pixels (y down), its text rising to the right by ``degrees``."""
    t = math.radians(degrees)
    ex, ey = math.cos(t), -math.sin(t)  # along the text
    nx, ny = math.sin(t), math.cos(t)  # down the text
    return [(cx + sx * w / 2 * ex + sy * h / 2 * nx, cy + sx * w / 2 * ey + sy * h / 2 * ny)
            for sx, sy in ((-1, -1), (1, -1), (1, 1), (-1, 1))]


def _page(page: int, lines: Sequence[tuple[str, list[Point] | None]] = (), *, size: tuple[int, int] | None,
          status: JobStatus = JobStatus.SUCCEEDED, **fields: Any) -> PageResult:
    text = "\n".join(t for t, _ in lines)
    width, height = size or (None, None)
    return PageResult(job_id=f"job-{page}", source="s3://archive/doc.pdf", page=page, status=status,
                      lines=[Line(text=t, quad=q) for t, q in lines], text=fields.pop("text", text),
                      width=width, height=height, **fields)


def _image(size: tuple[int, int], *, ink: Sequence[list[Point]] = (), mode: str = "RGB") -> Image.Image:
    """A white page with a black box where each quad is: the ink the lines were read from."""
    img = Image.new(mode, size, "white")
    draw = ImageDraw.Draw(img)
    for quad in ink:
        draw.polygon(quad, fill="black")
    return img


def _encoded(img: Image.Image, fmt: str, **options: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **options)
    return buf.getvalue()


@contextmanager
def _opened(data: bytes) -> Iterator[pdfium.PdfDocument]:
    pdf = pdfium.PdfDocument(data)
    try:
        yield pdf
    finally:
        pdf.close()


def _points(quad: list[Point], *, scale: float, page_height: float) -> list[Point]:
    """Image pixels (y down) -> PDF points (y up) on a page with no crop box offset and no rotation."""
    return [(x * scale, page_height - y * scale) for x, y in quad]


def _bbox(points: list[Point]) -> Box:
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    return min(xs), min(ys), max(xs), max(ys)


def _inside(box: Box, by: float) -> Box:
    return box[0] + by, box[1] + by, box[2] - by, box[3] - by


def _char_boxes(textpage: pdfium.PdfTextPage, text: str) -> list[Box]:
    """The boxes of ``text``'s characters, where it stands in the page's text (BMP text only)."""
    start = textpage.get_text_range().index(text)
    return [textpage.get_charbox(i) for i in range(start, start + len(text))]


def _ink(rendered: np.ndarray) -> Box:
    """The pixel box (x0, y0, x1, y1) of the dark pixels of a render."""
    dark = np.argwhere(rendered[..., :3].max(axis=2) < 100)
    (y0, x0), (y1, x1) = dark.min(axis=0), dark.max(axis=0) + 1
    return float(x0), float(y0), float(x1), float(y1)


def _render(page: pdfium.PdfPage, scale: float) -> np.ndarray:
    return np.asarray(page.render(scale=scale, rev_byteorder=True).to_numpy())  # RGB


def _image_objects(page: pdfium.PdfPage) -> list[pdfium.PdfImage]:
    return list(page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE]))


# -- the searchable PDF --------------------------------------------------------------------------------

SIZE = (1240, 1754)  # an A4 page at 150 dpi
STRAIGHT = [("Invoice 2024-117", _quad(100, 100, 700, 60)), ("Grüße aus Köln", _quad(100, 300, 600, 60)),
            ("東京都渋谷区", _quad(100, 500, 480, 80))]
TURNED = ("Stamp PAID", _turned(800, 1200, 400, 60, 30))
ASTRAL = ("𝔸 ✓ 😀", _quad(100, 1500, 300, 50))


def test_a_jpeg_page_gets_its_bytes_as_they_are_and_invisible_text_spanning_each_quad() -> None:
    jpeg = _encoded(_image(SIZE), "JPEG", quality=80, dpi=(150, 150))
    pdf = searchable_pdf([_page(1, [*STRAIGHT, TURNED, ASTRAL], size=SIZE)], original=jpeg, ext=".jpg")

    with _opened(pdf) as doc:
        page = doc[0]
        width, height = page.get_size()
        assert (width, height) == pytest.approx((SIZE[0] * 72 / 150, SIZE[1] * 72 / 150))  # its own dpi
        [image] = _image_objects(page)
        assert image.get_filters() == ["DCTDecode"] and bytes(image.get_data(decode_simple=False)) == jpeg
        textpage = page.get_textpage()
        read = textpage.get_text_range().split("\r\n")
        assert read == [t for t, _ in [*STRAIGHT, TURNED, ASTRAL]]
        scale = 72 / 150
        for text, quad in STRAIGHT:
            left, bottom, right, top = box = _bbox(_points(quad, scale=scale, page_height=height))
            assert textpage.get_text_bounded(*_inside(box, 1.0)) == text
            chars = _char_boxes(textpage, text)  # the line's text spans its quad: scaled, not just placed
            assert chars[0][0] == pytest.approx(left, abs=0.5) and chars[-1][2] == pytest.approx(right, abs=0.5)
            assert all(c[1] == pytest.approx(bottom, abs=0.5) and c[3] == pytest.approx(top, abs=0.5) for c in chars)
        # The turned line runs along its quad's top edge, rising 30 degrees.
        text, quad = TURNED
        assert textpage.get_text_bounded(*_bbox(_points(quad, scale=scale, page_height=height))) == text
        first, last = (((b[0] + b[2]) / 2, (b[1] + b[3]) / 2) for b in _char_boxes(textpage, text)[::len(text) - 1])
        assert math.degrees(math.atan2(last[1] - first[1], last[0] - first[0])) == pytest.approx(30, abs=2)
        # Invisible: the glyphs are solid boxes, so any other render mode would paint the white page.
        assert _render(page, 0.5).min() > 200


def _two_page_pdf() -> tuple[bytes, list[Box]]:
    """A letter page and a landscape one shown turned (/Rotate 90, a crop box), one black bar on each;
    the bars' boxes in page space."""
    pdf = pdfium.PdfDocument.new()
    bars = [(72.0, 600.0, 400.0, 630.0), (300.0, 100.0, 330.0, 500.0)]  # the second is upright once turned
    for (w, h), (left, bottom, right, top) in zip([(612, 792), (842, 595)], bars):
        page = pdf.new_page(w, h)
        bar = pdfium_c.FPDFPageObj_CreateNewRect(left, bottom, right - left, top - bottom)
        pdfium_c.FPDFPageObj_SetFillColor(bar, 0, 0, 0, 255)
        pdfium_c.FPDFPath_SetDrawMode(bar, pdfium_c.FPDF_FILLMODE_WINDING, False)
        pdfium_c.FPDFPage_InsertObject(page.raw, bar)
        page.gen_content()
    pdf[1].set_cropbox(20, 10, 800, 580)
    pdf[1].set_rotation(90)
    buf = io.BytesIO()
    pdf.save(buf)
    pdf.close()
    return buf.getvalue(), bars


def test_a_pdf_original_keeps_its_pages_and_gets_the_text_on_the_ink_it_was_read_from() -> None:
    original, bars = _two_page_pdf()
    pages, renders, sizes = [], [], []
    with _opened(original) as doc:
        for i, text in enumerate(["Total due 1,234.00 EUR", "Zahlbar bis 31.12.2025"]):
            rendered = _render(doc[i], 300 / 72)  # as the worker renders a page at 300 dpi
            x0, y0, x1, y1 = _ink(rendered)
            size = (rendered.shape[1], rendered.shape[0])
            pages.append(_page(i + 1, [(text, _quad(x0, y0, x1 - x0, y1 - y0))], size=size))
            renders.append(rendered)
            sizes.append((doc[i].get_size(), doc[i].get_mediabox(), doc[i].get_rotation()))

    with _opened(searchable_pdf(pages, original=original, ext=".pdf")) as out:
        assert len(out) == 2
        for i, (result, bar) in enumerate(zip(pages, bars)):
            page = out[i]
            assert (page.get_size(), page.get_mediabox(), page.get_rotation()) == sizes[i]
            assert np.array_equal(_render(page, 300 / 72), renders[i])  # the page as it was; the text unseen
            textpage = page.get_textpage()
            assert textpage.get_text_range() == result.lines[0].text
            assert textpage.get_text_bounded(*_inside(bar, 2.0)) == result.lines[0].text  # on the bar


def test_a_failed_page_is_kept_with_its_image_and_marked_in_red() -> None:
    frames = [_image((600, 800), ink=[_quad(50, 50, 300, 40)], mode="L") for _ in range(3)]
    tiff = _encoded(frames[0], "TIFF", save_all=True, append_images=frames[1:], dpi=(200, 200))
    line = [("Page text", _quad(50, 50, 300, 40))]
    pages = [_page(1, line, size=(600, 800)),
             _page(2, size=(600, 800), status=JobStatus.FAILED, error="engine timed out after 120 s"),
             _page(3, line, size=(600, 800))]

    with _opened(searchable_pdf(pages, original=tiff, ext=".tif")) as out:
        assert len(out) == 3
        for i in range(3):
            assert out[i].get_size() == pytest.approx((600 * 72 / 200, 800 * 72 / 200))
            assert len(_image_objects(out[i])) == 1  # the frame is there, failed or not
        assert out[1].get_textpage().get_text_range() == "paperlane: page 2 failed: engine timed out after 120 s"
        assert [out[i].get_textpage().get_text_range() for i in (0, 2)] == ["Page text", "Page text"]
        for i, marked in [(0, False), (1, True)]:
            corner = _render(out[i], 2)[:40, :].astype(int)  # RGB(A) of the top strip
            red = (corner[..., 0] > 150) & (corner[..., 1] < 80) & (corner[..., 2] < 80)
            assert bool(red.any()) is marked


@pytest.mark.parametrize("original, ext", [(None, ".png"), (b"not an image at all", ".png"),
                                          (b"%PDF-1.7\nbroken", ".pdf")])
def test_without_a_readable_original_each_page_is_blank_at_its_size_and_still_searchable(
        original: bytes | None, ext: str) -> None:
    pages = [_page(1, [("Kept text", _quad(300, 300, 900, 90))], size=(2480, 3508)),
             _page(2, size=None, status=JobStatus.FAILED, error="unreadable image")]

    with _opened(searchable_pdf(pages, original=original, ext=ext)) as out:
        assert [out[i].get_size() for i in range(2)] == [pytest.approx((595.2, 841.92)), (595.0, 842.0)]  # A4
        textpage = out[0].get_textpage()
        box = _bbox(_points(_quad(300, 300, 900, 90), scale=72 / 300, page_height=841.92))
        assert textpage.get_text_bounded(*_inside(box, 1.0)) == "Kept text"
        assert out[1].get_textpage().get_text_range() == "paperlane: page 2 failed: unreadable image"


def test_a_page_the_original_lacks_is_added_and_an_image_over_the_pixel_cap_is_not_decoded() -> None:
    png = _encoded(_image((400, 300)), "PNG")
    pages = [_page(1, [("one", _quad(10, 10, 100, 20))], size=(400, 300)),
             _page(2, [("two", _quad(10, 10, 100, 20))], size=(800, 600))]

    with _opened(searchable_pdf(pages, original=png, ext=".png", max_pixels=400 * 300 - 1)) as out:
        assert len(out) == 2 and out[1].get_size() == pytest.approx((192.0, 144.0))
        assert [len(_image_objects(out[i])) for i in range(2)] == [0, 0]
        assert [out[i].get_textpage().get_text_range() for i in range(2)] == ["one", "two"]
    with _opened(searchable_pdf(pages[:1], original=png, ext=".png")) as out:
        [image] = _image_objects(out[0])
        assert image.get_filters() == ["FlateDecode"]  # lossless


def _in_mode(img: Image.Image, mode: str) -> Image.Image:
    grey = img.convert("L")
    if mode == "I;16":  # real 16-bit values, as a 16-bit scan has
        return Image.fromarray(np.asarray(grey, dtype=np.uint16) * 257)
    if mode == "RGBA":  # the ink opaque, the rest transparent black: flattened on white
        return Image.merge("RGBA", [Image.new("L", img.size, 0)] * 3 + [grey.point(lambda v: 255 - v)])
    return img.convert(mode)


@pytest.mark.parametrize("mode, fmt", [("1", "TIFF"), ("L", "PNG"), ("I;16", "PNG"), ("P", "PNG"), ("LA", "PNG"),
                                       ("RGBA", "PNG"), ("CMYK", "TIFF"), ("CMYK", "JPEG")])
def test_an_image_in_any_mode_becomes_its_page_with_its_ink_where_it_was(mode: str, fmt: str) -> None:
    data = _encoded(_in_mode(_image((300, 200), ink=[_quad(50, 50, 100, 40)]), mode), fmt)
    pdf = searchable_pdf([_page(1, [("ink", _quad(50, 50, 100, 40))], size=(300, 200))], original=data, ext=".x")
    with _opened(pdf) as out:
        assert out[0].get_size() == pytest.approx((72.0, 48.0))
        assert _ink(_render(out[0], 300 / 72)) == pytest.approx((50, 50, 150, 90), abs=2)
        assert out[0].get_textpage().get_text_range() == "ink"


# What stores an upright image so that each EXIF orientation turns it back (Pillow's exif_transpose inverted).
_STORED = {1: None, 2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
           4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_90,
           7: Image.Transpose.TRANSVERSE, 8: Image.Transpose.ROTATE_270}


@pytest.mark.parametrize("orientation", sorted(_STORED))
def test_an_exif_oriented_jpeg_shows_upright_with_its_text_on_its_ink(orientation: int) -> None:
    upright, quad = (600, 400), _quad(50, 60, 300, 50)  # off centre both ways: a flip would move it
    img, turn = _image(upright, ink=[quad]), _STORED[orientation]
    exif = Image.Exif()
    exif[0x0112] = orientation
    jpeg = _encoded(img if turn is None else img.transpose(turn), "JPEG", quality=95, exif=exif)

    pdf = searchable_pdf([_page(1, [("upright", quad)], size=upright)], original=jpeg, ext=".jpg")
    with _opened(pdf) as out:
        page = out[0]
        assert page.get_size() == pytest.approx((144.0, 96.0))  # 300 dpi: the EXIF states none
        assert _ink(_render(page, 300 / 72)) == pytest.approx((50, 60, 350, 110), abs=2)
        box = _bbox(_points(quad, scale=72 / 300, page_height=96))
        assert page.get_textpage().get_text_bounded(*_inside(box, 1.0)) == "upright"
        [image] = _image_objects(page)
        assert bytes(image.get_data(decode_simple=False)) == jpeg  # turned by its matrix, not re-encoded


def test_lines_without_quads_are_searchable_and_fields_are_not_page_text() -> None:
    parse = _page(1, size=(1240, 1754), task=Task.PARSE, text="Annual report\nRevenue grew 12 %",
                  markdown="# Annual report\n\nRevenue grew 12 %")
    fields = _page(2, size=(1240, 1754), task=Task.FIELDS, fields={"total": "12.00"}, text='{"total": "12.00"}')
    with _opened(searchable_pdf([parse, fields], original=None, ext=".png")) as out:
        assert out[0].get_textpage().get_text_range().split("\r\n") == ["Annual report", "Revenue grew 12 %"]
        assert out[1].get_textpage().get_text_range() == ""


def test_engine_nonsense_in_quads_and_text_does_not_break_the_pdf() -> None:
    nan = float("nan")
    lines: list[tuple[str, list[Point] | None]] = [
        ("good\tline\x00", _quad(10, 10, 200, 30)), ("nan", [(nan, 1.0), (5.0, 5.0), (9.0, 9.0), (1.0, 1.0)]),
        ("huge", _quad(1e300, 10, 1e300, 30)), ("three", [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)]),
        ("flat", _quad(10, 100, 200, 0)), ("   ", _quad(10, 200, 200, 30)), ("lone \ud800 surrogate", None)]
    with _opened(searchable_pdf([_page(1, lines, size=(400, 400))], original=None, ext=".jpg")) as out:
        assert out[0].get_textpage().get_text_range() == "good line"


def test_the_same_inputs_give_the_same_pdf_bytes() -> None:
    original, _ = _two_page_pdf()
    pages = [_page(1, [("text", _quad(10, 10, 100, 20))], size=(2550, 3300)),
             _page(2, size=None, status=JobStatus.FAILED, error="x")]
    jpeg = _encoded(_image((400, 300)), "JPEG")
    for data, ext in [(original, ".pdf"), (jpeg, ".jpg"), (None, ".jpg")]:
        assert searchable_pdf(pages, original=data, ext=ext) == searchable_pdf(pages, original=data, ext=ext)
    # Not the clock either: a document PDFium makes carries no time of its making (the same bytes a second later).
    assert b"/CreationDate(D:19700101000000" in searchable_pdf(pages, original=jpeg, ext=".jpg")


# -- markdown and JSON ---------------------------------------------------------------------------------

def _document() -> list[PageResult]:
    return [
        _page(1, [("First line", _quad(0, 0, 10, 10)), ("Second line", _quad(0, 20, 10, 10))], size=(100, 100)),
        _page(2, size=(100, 100), task=Task.PARSE, text="Title\nBody", markdown="# Title\n\nBody ```x```"),
        _page(3, size=None, status=JobStatus.FAILED, error="engine timed out\n(after 120 s)"),
        _page(4, size=(100, 100), task=Task.FIELDS, fields={"total": "`12`", "date": None},
              missing_fields=["date"], truncated=True),
        _page(5, size=None, status=JobStatus.QUEUED),
    ]


def test_markdown_is_the_text_in_page_order_with_failed_pages_marked() -> None:
    shuffled = _document()
    random.Random(3).shuffle(shuffled)
    assert document_markdown(shuffled) == (
        "<!-- page 1 -->\n\nFirst line\nSecond line\n\n---\n\n"
        "<!-- page 2 -->\n\n# Title\n\nBody ```x```\n\n---\n\n"
        "<!-- page 3 -->\n\n> page 3 failed: engine timed out (after 120 s)\n\n---\n\n"
        '<!-- page 4 -->\n\n```json\n{\n  "total": "`12`",\n  "date": null\n}\n```\n\n'
        "> page 4: not found on the page: date\n\n"
        "> page 4: the engine stopped at its token limit; this page is incomplete\n\n---\n\n"
        "<!-- page 5 -->\n\n> page 5 has no result (queued)\n"
    )


def test_document_json_has_every_page_in_order_and_counts_failures() -> None:
    pages = _document()
    data = document_json(document_id="doc-1", source="s3://archive/doc.pdf", name="doc", pages=pages[::-1])
    doc = json.loads(data)
    assert {k: v for k, v in doc.items() if k != "pages"} == {
        "document_id": "doc-1", "source": "s3://archive/doc.pdf", "name": "doc", "page_count": 5,
        "counts": {"queued": 1, "running": 0, "succeeded": 3, "failed": 1}, "failed_pages": [3]}
    assert [PageResult.model_validate(p) for p in doc["pages"]] == pages  # each page's whole result, in order
    assert doc["pages"][2]["status"] == "failed" and doc["pages"][2]["error"] == "engine timed out\n(after 120 s)"
    assert "東京" in document_json(document_id="d", source="s", name="n",
                                 pages=[_page(1, [("東京", None)], size=None)]).decode()  # UTF-8, not escapes
    assert data == document_json(document_id="doc-1", source="s3://archive/doc.pdf", name="doc", pages=pages)


def test_the_text_layer_is_invisible_text_in_the_embedded_glyphless_font() -> None:
    """The font is built in memory and embedded: no font file on the machine, nothing downloaded."""
    with _opened(searchable_pdf([_page(1, [STRAIGHT[2]], size=SIZE)], original=None, ext=".png")) as out:
        page = out[0]
        [text_obj] = list(page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_TEXT]))
        assert pdfium_c.FPDFTextObj_GetTextRenderMode(text_obj.raw) == pdfium_c.FPDF_TEXTRENDERMODE_INVISIBLE
        font = pdfium_c.FPDFTextObj_GetFont(text_obj.raw)
        assert pdfium_c.FPDFFont_GetIsEmbedded(font) == 1
        name = ctypes.create_string_buffer(64)
        pdfium_c.FPDFFont_GetBaseFontName(font, name, 64)
        assert name.value.endswith(b"GlyphLessFont")
