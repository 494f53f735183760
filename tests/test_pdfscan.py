"""Scanned PDF pages: one image taken from its own bytes gives the picture PDFium's render gives; anything else
on the page, or anything PDFium would apply to the image that its bytes do not show, gets the page rendered."""

from __future__ import annotations

import io
from collections.abc import Callable

import cv2
import numpy as np
import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
import pytest
from PIL import Image, ImageDraw, features

from paperlane.errors import InputError
from paperlane.models.engine import InputSpec
from paperlane.workers import pdfscan
from paperlane.workers.fit import target_size
from paperlane.workers.input_limits import Limits
from paperlane.workers.pdf_pages import PDF_DPI, PDFIUM_LOCK, open_pdf, render_pdf_page, scanned_pixels
from paperlane.workers.preprocess import prepare_page
from tests.pages import add_text, bilevel_pdf, pdf_bytes, sample_lines
from tests.test_preprocess import VLM_SPEC, handmade_pdf

A4 = (595.0, 842.0)
GREY_SPEC = InputSpec(max_side=1600, grayscale=True)


def scan_image(mode: str = "L", size: tuple[int, int] = (1240, 1754), *, seed: int = 1,
               paper: tuple[int, int, int] = (250, 248, 240)) -> Image.Image:
    """A page as a scanner sees it: text lines, and a large black block in its top-left quarter (so that a
    page turned, mirrored or placed the wrong way differs from the render over a large area)."""
    img = Image.new("RGB", size, paper)
    draw = ImageDraw.Draw(img)
    w, h = size
    draw.rectangle((w // 12, h // 20, w // 2, h // 4), fill=(0, 0, 0))
    draw.rectangle((w * 2 // 3, h * 3 // 4, w * 5 // 6, h * 5 // 6), fill=(200, 30, 30))
    for i, line in enumerate(sample_lines(seed, 12)):
        draw.text((w // 12, h // 5 + i * h // 18), line, fill=(20, 20, 20), font_size=max(12, h // 45))
    return img.convert(mode)


def jpeg_of(img: Image.Image, *, exif_orientation: int | None = None) -> bytes:
    buf = io.BytesIO()
    exif = Image.Exif()
    if exif_orientation:
        exif[0x0112] = exif_orientation
    img.save(buf, format="JPEG", quality=92, exif=exif)
    return buf.getvalue()


def image_pdf(fill: Callable[[pdfium.PdfImage], None], *, page_pt: tuple[float, float] = A4,
              matrix: tuple[float, ...] | None = None, rotate: int = 0,
              crop: tuple[float, float, float, float] | None = None,
              extra: Callable[[pdfium.PdfDocument, pdfium.PdfPage], None] | None = None) -> bytes:
    """A one-page PDF of ``page_pt`` holding one image (``fill`` loads it), drawn by ``matrix`` (default: over
    the whole page), with ``/Rotate`` ``rotate`` and crop box ``crop``; ``extra`` adds to the page."""
    pdf = pdfium.PdfDocument.new()
    page = pdf.new_page(*page_pt)
    image = pdfium.PdfImage.new(pdf)
    fill(image)
    image.set_matrix(pdfium.PdfMatrix(*(matrix or (page_pt[0], 0, 0, page_pt[1], 0, 0))))
    page.insert_obj(image)
    if extra is not None:
        extra(pdf, page)
    page.gen_content()
    if rotate:
        page.set_rotation(rotate)
    if crop is not None:
        page.set_cropbox(*crop)
    page.close()
    return pdf_bytes(pdf)


def jpeg_pdf(jpeg: bytes, **kwargs: object) -> bytes:
    return image_pdf(lambda image: image.load_jpeg(io.BytesIO(jpeg), inline=True), **kwargs)  # type: ignore[arg-type]


def flate_pdf(img: Image.Image, **kwargs: object) -> bytes:
    return image_pdf(lambda image: image.set_bitmap(pdfium.PdfBitmap.from_pil(img)), **kwargs)  # type: ignore[arg-type]


def ccitt_pdf(img: Image.Image, *, rotate: int = 0, crop: tuple[float, float, float, float] | None = None,
              pages: int = 1) -> bytes:
    """``img`` as a bilevel page in CCITT G4, as Pillow's PDF writer stores it (/BlackIs1 true), at 150 dpi."""
    pdf = pdfium.PdfDocument(bilevel_pdf([img] * pages, dpi=150))
    for page in pdf:
        if rotate:
            page.set_rotation(rotate)
        if crop is not None:
            page.set_cropbox(*crop)
    return pdf_bytes(pdf)


def reference(data: bytes, spec: InputSpec, page: int = 1) -> np.ndarray:
    """What PDFium's render of the page at the engine's size shows (BGR): the picture the fast path must give."""
    with PDFIUM_LOCK:
        pdf = pdfium.PdfDocument(data)
        pdf_page = pdf[page - 1]
        w_pt, h_pt = pdf_page.get_size()
        tw, th = target_size(round(w_pt * PDF_DPI / 72), round(h_pt * PDF_DPI / 72), spec)
        bitmap = pdfium.PdfBitmap.new_native(tw, th, format=pdfium_c.FPDFBitmap_BGR)
        bitmap.fill_rect((255, 255, 255, 255), 0, 0, tw, th)
        pdfium_c.FPDF_RenderPageBitmap(bitmap, pdf_page, 0, 0, tw, th, 0, pdfium_c.FPDF_ANNOT)
        img = bitmap.to_numpy().copy()
        bitmap.close()
        pdf_page.close()
        pdf.close()
    return img


def fast(data: bytes, spec: InputSpec, page: int = 1) -> np.ndarray | None:
    """The fast path's picture of the page (None: it would render the page), as the worker prepares it."""
    pdf = open_pdf(data)
    try:
        with PDFIUM_LOCK:
            pdf_page = pdf.pdf[page - 1]
            w_pt, h_pt = pdf_page.get_size()
            size = target_size(round(w_pt * PDF_DPI / 72), round(h_pt * PDF_DPI / 72), spec)
            try:
                return scanned_pixels(pdf_page, size, spec, Limits(), pdf.image_dicts)
            finally:
                pdf_page.close()
    finally:
        pdf.close()


def assert_same_picture(data: bytes, spec: InputSpec = VLM_SPEC, *, page: int = 1, tolerance: float = 4.0) -> None:
    got = fast(data, spec, page)
    assert got is not None, "the page was not taken from its image"
    want = reference(data, spec, page)
    assert got.shape[:2] == want.shape[:2]  # the same size (and so the same orientation of the sides)
    if got.ndim == 2:  # a grey image stays grey
        want = cv2.cvtColor(want, cv2.COLOR_BGR2GRAY)
    # Resampling differs (PDFium's own filter, ours): compare what a reader sees, not single pixels.
    diff = np.abs(cv2.blur(got, (5, 5)).astype(np.int16) - cv2.blur(want, (5, 5)).astype(np.int16))
    assert diff.mean() < tolerance, diff.mean()
    assert np.percentile(diff, 99) < 16 * tolerance, np.percentile(diff, 99)


# --- The same picture as the render ---------------------------------------------------------------------------


@pytest.mark.parametrize("rotate", [0, 90, 180, 270])
def test_a_grey_jpeg_scan_is_its_own_jpeg_turned_as_the_page_is(rotate: int) -> None:
    assert_same_picture(jpeg_pdf(jpeg_of(scan_image()), rotate=rotate))


@pytest.mark.parametrize("rotate", [0, 90])
def test_a_colour_jpeg_scan_stays_colour_and_matches(rotate: int) -> None:
    data = jpeg_pdf(jpeg_of(scan_image("RGB")), rotate=rotate)
    assert_same_picture(data)  # in colour: channels compared one by one
    got = fast(data, VLM_SPEC)
    assert got is not None and got.ndim == 3


def test_a_cmyk_jpeg_is_decoded_by_pdfium_and_matches() -> None:
    # Pillow writes CMYK JPEGs as Photoshop does (Adobe marker, inverted samples); a PDF reader sorts it out.
    img = scan_image("CMYK", size=(620, 877))
    stream = jpeg_of(img)
    data = handmade_image_page(GREY_JPEG.replace(b"/DeviceGray", b"/DeviceCMYK").replace(
        b"/Width 310 /Height 438", b"/Width 620 /Height 877"), stream)
    assert_same_picture(data)


@pytest.mark.parametrize("rotate", [0, 90, 180, 270])
def test_a_ccitt_g4_scan_is_decoded_by_pdfium_and_matches(rotate: int) -> None:
    assert_same_picture(ccitt_pdf(scan_image(), rotate=rotate), tolerance=6.0)


def test_a_flate_scan_matches() -> None:
    assert_same_picture(flate_pdf(scan_image()))  # PDFium stores a grey bitmap with a palette (/Indexed)
    assert_same_picture(flate_pdf(scan_image("RGB"), rotate=180), InputSpec(encoding="jpeg", max_side=1280,
                                                                            multiple_of=28))


@pytest.mark.skipif(not features.check("jpg_2000"), reason="Pillow built without OpenJPEG")
def test_a_jpeg_2000_scan_matches() -> None:
    buf = io.BytesIO()
    img = scan_image(size=(620, 877))
    img.save(buf, format="JPEG2000")
    stream = buf.getvalue()
    data = handmade_pdf(
        b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Contents 4 0 R "
        b"/Resources << /XObject << /Im1 5 0 R >> >> >>",
        b"<< /Length 30 >>\nstream\nq 595 0 0 842 0 0 cm /Im1 Do Q\nendstream",
        b"<< /Type /XObject /Subtype /Image /Width 620 /Height 877 /ColorSpace /DeviceGray /BitsPerComponent 8 "
        b"/Filter /JPXDecode /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream),
    )
    assert_same_picture(data)


def test_a_crop_box_and_an_image_placed_with_margins_match() -> None:
    jpeg = jpeg_of(scan_image(paper=(150, 150, 150)))  # grey paper: the white margins must be where they are
    # The image 400 x 566 pt, 100 pt from the left and 150 pt from the bottom: white margins around it.
    assert_same_picture(jpeg_pdf(jpeg, matrix=(400, 0, 0, 566, 100, 150)))
    # A crop box that cuts into the image, on a page turned a quarter.
    assert_same_picture(jpeg_pdf(jpeg, crop=(50, 100, 500, 800), rotate=90))
    assert_same_picture(ccitt_pdf(scan_image(), crop=(40, 60, 560, 700), rotate=270), tolerance=6.0)


@pytest.mark.parametrize("matrix", [
    (-595, 0, 0, 842, 595, 0),  # mirrored left to right
    (595, 0, 0, -842, 0, 842),  # upside down, as some writers store a scan
    (0, 842, -595, 0, 595, 0),  # turned a quarter by its matrix, not by /Rotate
])
def test_an_image_mirrored_or_turned_by_its_matrix_matches(matrix: tuple[float, ...]) -> None:
    turned = matrix[0] == 0
    img = scan_image(size=(1754, 1240)) if turned else scan_image()
    assert_same_picture(jpeg_pdf(jpeg_of(img), matrix=matrix))


def test_exif_orientation_inside_a_pdf_is_ignored_as_pdf_readers_ignore_it() -> None:
    assert_same_picture(jpeg_pdf(jpeg_of(scan_image(), exif_orientation=6)))


def test_an_invisible_text_layer_draws_nothing_and_is_no_obstacle() -> None:
    data = jpeg_pdf(jpeg_of(scan_image()), extra=text_layer(pdfium_c.FPDF_TEXTRENDERMODE_INVISIBLE))
    assert_same_picture(data)


def test_a_grey_scan_stays_grey_for_a_colour_engine_and_maps_to_300_dpi_pixels() -> None:
    data = jpeg_pdf(jpeg_of(scan_image()))
    page = prepare_page(data, VLM_SPEC, preview_side=500)
    assert (page.width, page.height) == (2479, 3508)
    assert (page.image.width, page.image.height) == target_size(2479, 3508, VLM_SPEC)
    assert page.image.data is not None
    sent = cv2.imdecode(np.frombuffer(page.image.data, np.uint8), cv2.IMREAD_UNCHANGED)
    assert sent is not None and sent.ndim == 2  # one channel, as a grey JPEG file is sent
    assert page.preview is not None and max(page.preview.shape) == 500


# --- Rendered instead ----------------------------------------------------------------------------------------


def text_layer(mode: int) -> Callable[[pdfium.PdfDocument, pdfium.PdfPage], None]:
    def add(pdf: pdfium.PdfDocument, page: pdfium.PdfPage) -> None:
        add_text(pdf, page, "Invoice total 1234", x=100, y=700, size=24, mode=mode)
    return add


def rectangle(pdf: pdfium.PdfDocument, page: pdfium.PdfPage) -> None:
    rect = pdfium_c.FPDFPageObj_CreateNewRect(100, 100, 50, 50)
    pdfium_c.FPDFPageObj_SetFillColor(rect, 0, 0, 0, 255)
    pdfium_c.FPDFPath_SetDrawMode(rect, pdfium_c.FPDF_FILLMODE_ALTERNATE, False)
    pdfium_c.FPDFPage_InsertObject(page, rect)


def second_image(pdf: pdfium.PdfDocument, page: pdfium.PdfPage) -> None:
    image = pdfium.PdfImage.new(pdf)
    image.load_jpeg(io.BytesIO(jpeg_of(scan_image(size=(100, 100)))), inline=True)
    image.set_matrix(pdfium.PdfMatrix(100, 0, 0, 100, 10, 10))
    page.insert_obj(image)


def annotation(pdf: pdfium.PdfDocument, page: pdfium.PdfPage) -> None:
    annot = pdfium_c.FPDFPage_CreateAnnot(page, pdfium_c.FPDF_ANNOT_SQUARE)
    rect = pdfium_c.FS_RECTF(100, 700, 300, 500)
    pdfium_c.FPDFAnnot_SetRect(annot, rect)
    pdfium_c.FPDFPage_CloseAnnot(annot)


@pytest.mark.parametrize(("name", "extra"), [
    ("visible text", text_layer(pdfium_c.FPDF_TEXTRENDERMODE_FILL)),
    ("a vector drawing", rectangle),
    ("a second image", second_image),
    ("an annotation", annotation),
])
def test_a_page_with_more_than_its_image_is_rendered(name: str, extra: Callable[..., None]) -> None:
    assert fast(jpeg_pdf(jpeg_of(scan_image()), extra=extra), VLM_SPEC) is None, name


def test_a_clip_around_the_image_is_no_obstacle_and_one_inside_it_gets_the_page_rendered() -> None:
    stream = jpeg_of(SMALL)
    assert_same_picture(handmade_image_page(GREY_JPEG, stream, clip=b"0 0 595 842 re W n"))
    assert_same_picture(handmade_image_page(GREY_JPEG, stream, clip=b"-10 -10 700 900 re W n"))
    assert fast(handmade_image_page(GREY_JPEG, stream, clip=b"50 50 400 600 re W n"), VLM_SPEC) is None
    assert fast(handmade_image_page(GREY_JPEG, stream, clip=b"300 421 m 595 842 l 0 842 l h W n"), VLM_SPEC) is None


def test_a_skewed_image_is_rendered() -> None:
    assert fast(jpeg_pdf(jpeg_of(scan_image()), matrix=(590, 40, -60, 835, 40, 0)), VLM_SPEC) is None


def handmade_image_page(image_dict: bytes, stream: bytes, *, extra_objects: tuple[bytes, ...] = (),
                        clip: bytes = b"", length: bytes | None = None) -> bytes:
    """A page drawing image object 5 (``image_dict`` without /Length, then ``stream``) over all of A4,
    within ``clip`` (a path and W n); ``length``: its /Length value (default: the stream's length)."""
    draw = b"q %s q 595 0 0 842 0 0 cm /Im1 Do Q Q" % clip
    return handmade_pdf(
        b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Contents 4 0 R "
        b"/Resources << /XObject << /Im1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(draw), draw),
        b"<< %s /Length %s >>\nstream\n%s\nendstream" % (image_dict, length or b"%d" % len(stream), stream),
        *extra_objects,
    )


SMALL = scan_image(size=(310, 438))
GREY_JPEG = b"/Type /XObject /Subtype /Image /Width 310 /Height 438 /ColorSpace /DeviceGray /BitsPerComponent 8 " \
            b"/Filter /DCTDecode"
MASK = (b"<< /Type /XObject /Subtype /Image /Width 2 /Height 2 /ColorSpace /DeviceGray /BitsPerComponent 8 "
        b"/Length 4 >>\nstream\n\x00\x80\xff\x40\nendstream",)


@pytest.mark.parametrize(("name", "entries", "extra"), [
    ("inverted by /Decode", b"/Decode [1 0]", ()),
    ("a soft mask", b"/SMask 6 0 R", MASK),
    ("a stencil mask", b"/Mask 6 0 R", MASK),
    ("a colour-key mask", b"/Mask [0 128]", ()),
])
def test_an_image_pdfium_draws_otherwise_than_its_bytes_say_is_rendered(name: str, entries: bytes,
                                                                       extra: tuple[bytes, ...]) -> None:
    plain = handmade_image_page(GREY_JPEG, jpeg_of(SMALL))
    assert_same_picture(plain)  # the same image without them is taken as it is
    data = handmade_image_page(GREY_JPEG + b" " + entries, jpeg_of(SMALL), extra_objects=extra)
    assert fast(data, VLM_SPEC) is None, name
    # and rendered: what the worker prepares is PDFium's picture
    got, _, _ = render_pdf_page(data, 1, GREY_SPEC, Limits())
    want = cv2.cvtColor(reference(data, GREY_SPEC), cv2.COLOR_BGR2GRAY)
    assert np.abs(got.astype(np.int16) - want.astype(np.int16)).mean() < 1.0


def test_an_image_whose_stream_length_is_an_indirect_object_is_found_too() -> None:
    stream = jpeg_of(SMALL)
    size = (b"%d" % len(stream),)
    assert_same_picture(handmade_image_page(GREY_JPEG, stream, extra_objects=size, length=b"6 0 R"))
    masked = handmade_image_page(GREY_JPEG + b" /SMask 7 0 R", stream, extra_objects=(*size, *MASK),
                                 length=b"6 0 R")
    assert fast(masked, VLM_SPEC) is None


def test_a_transfer_function_anywhere_in_the_file_gets_the_page_rendered() -> None:
    gstate = (b"<< /Type /ExtGState /TR /Identity >>",)
    data = handmade_image_page(GREY_JPEG, jpeg_of(SMALL), extra_objects=gstate)
    assert fast(data, VLM_SPEC) is None


def test_an_image_whose_dictionary_is_not_found_in_the_file_is_rendered() -> None:
    # Indirect /Length and an image stream whose bytes pdfium reads but the index cannot place: with an
    # encrypted file (the stream bytes in the file differ from the ones pdfium decrypts) it is the same.
    dicts = pdfscan.ImageDicts(lambda: b"%PDF-1.7 nothing here")
    data = handmade_image_page(GREY_JPEG, jpeg_of(SMALL))
    pdf = open_pdf(data)
    with PDFIUM_LOCK:
        page = pdf.pdf[0]
        image = pdfscan.lone_image(page, (620, 877))
        assert image is not None
        assert not pdf.image_dicts.hidden(image)
        assert dicts.hidden(image)
        page.close()
    pdf.close()


def test_a_jpeg_that_declares_another_size_than_its_dictionary_is_left_to_pdfium() -> None:
    # The dictionary says 310 x 438; the JPEG inside is 620 x 876: never decoded by us at the JPEG's word.
    data = handmade_image_page(GREY_JPEG, jpeg_of(scan_image(size=(620, 876))))
    assert fast(data, VLM_SPEC) is None


def test_an_image_bomb_in_a_scan_is_refused_from_its_header() -> None:
    stream = jpeg_of(SMALL)
    entries = GREY_JPEG.replace(b"/Width 310 /Height 438", b"/Width 40000 /Height 40000")
    with pytest.raises(InputError, match=r"^PDF page 1 holds an image too large \(40000x40000"):
        prepare_page(handmade_image_page(entries, stream), VLM_SPEC)


def test_the_pages_of_a_multi_page_ccitt_pdf_are_each_their_image() -> None:
    data = ccitt_pdf(scan_image(), pages=3)
    for page in (1, 3):
        assert_same_picture(data, page=page, tolerance=6.0)
