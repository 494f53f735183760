"""Preprocessing: every unreadable page gets a clear reason; good pages get exactly the spec."""

from __future__ import annotations

import base64
import dataclasses
import io
import struct
import time

import cv2
import numpy as np
import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image, ImageOps

from paperlane.errors import InputError
from paperlane.models.engine import InputSpec
from paperlane.workers.fit import grey_preview, target_size
from paperlane.workers.input_limits import Limits
from paperlane.workers.preprocess import prepare_page
from tests.pages import BAD_INPUTS, huge_declared_png, prepare, render_page, sample_lines, truncated_jpeg

VLM_SPEC = InputSpec(encoding="jpeg", max_side=2048, max_pixels=2048 * 2048, min_pixels=512 * 512, multiple_of=32)


def very_wide_tiff(width: int = 2_000_000) -> bytes:
    """A 2 kB TIFF of width x 1 pixels: within our pixel limit, beyond OpenCV's widest image (2^20)."""
    buf = io.BytesIO()
    Image.new("L", (width, 1), 128).save(buf, format="TIFF", compression="tiff_deflate")
    return buf.getvalue()


def a4_grey_jpeg(lines: list[str]) -> bytes:
    """An A4 page at 300 dpi (2480x3508) as most document scanners write it: a one-component JPEG."""
    page = Image.new("L", (2480, 3508), 245)
    page.paste(Image.open(io.BytesIO(render_page(lines, width=2480))).convert("L"), (0, 200))
    buf = io.BytesIO()
    page.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_inputs_are_refused_with_a_reason(name: str) -> None:
    with pytest.raises(InputError) as info:
        prepare(BAD_INPUTS[name], InputSpec())
    assert info.value.stage == "preprocess" and not info.value.retryable
    assert "\n" not in str(info.value)


def test_truncated_jpeg_is_refused() -> None:
    with pytest.raises(InputError, match="truncated JPEG"):
        prepare(truncated_jpeg(sample_lines(1)), InputSpec())


def test_huge_declared_image_is_refused_before_decoding() -> None:
    with pytest.raises(InputError, match=r"image too large \(1600 MP, limit 150 MP\)"):
        prepare(huge_declared_png(), InputSpec(), Limits(max_pixels=150_000_000))


def test_grey_alpha_and_16bit_pages_become_bgr() -> None:
    rgba = Image.new("RGBA", (300, 200), (0, 0, 0, 0))
    buf = io.BytesIO()
    rgba.save(buf, format="PNG")
    img = prepare(buf.getvalue(), InputSpec()).pixels
    assert img is not None and img.shape == (200, 300, 3) and img.mean() > 250  # transparent -> white
    ok, grey16 = cv2.imencode(".png", np.full((50, 80), 40000, np.uint16))
    img = prepare(grey16.tobytes(), InputSpec()).pixels
    assert img is not None and img.shape == (50, 80, 3) and img.dtype == np.uint8


def test_jpeg_spec_gives_sized_bytes() -> None:
    spec = InputSpec(encoding="jpeg", max_side=2048, max_pixels=2048 * 2048, min_pixels=512 * 512, multiple_of=32)
    page = prepare(render_page(sample_lines(2), width=2480), spec)
    assert page.data is not None and page.mime == "image/jpeg" and page.pixels is None
    decoded = cv2.imdecode(np.frombuffer(page.data, np.uint8), cv2.IMREAD_COLOR)
    assert decoded.shape[:2] == (page.height, page.width)
    assert page.width % 32 == 0 and page.height % 32 == 0


@given(w=st.integers(1, 80000), h=st.integers(1, 30000), m=st.sampled_from([1, 28, 32]))
def test_target_size_respects_the_spec(w: int, h: int, m: int) -> None:
    spec = InputSpec(max_side=2048, max_pixels=2048 * 2048, min_pixels=512 * 512, multiple_of=m)
    tw, th = target_size(w, h, spec)
    assert tw % m == 0 and th % m == 0
    assert tw * th <= 2048 * 2048
    assert max(tw, th) <= 2048  # scaling up to min_pixels never overshoots max_side (a 70000x40 strip did)
    if w * h >= 600 * 600 and max(w, h) / min(w, h) < 4:
        assert tw * th >= 512 * 512 * 0.8


def test_large_declared_image_below_pillows_guard_names_its_size() -> None:
    with pytest.raises(InputError, match=r"image too large \(12000x10000 = 120 MP, limit 100 MP\)"):
        prepare(huge_declared_png(12000, 10000), InputSpec(), Limits(max_pixels=100_000_000))


def test_a4_jpeg_is_decoded_reduced_and_keeps_original_coordinates() -> None:
    page = render_page(sample_lines(5), fmt="JPEG", width=2480)
    spec = InputSpec(max_side=1300, grayscale=True)
    img = prepare(page, spec)
    with Image.open(io.BytesIO(page)) as im:
        assert (img.original_width, img.original_height) == im.size
    assert img.width == 1240  # decoded at 1/2 in the DCT domain, close enough to 1300: not resized
    assert img.pixels is not None and img.pixels.shape == (img.height, img.width, 3)
    # Rotated by EXIF and reduced: the original size is the upright one.
    turned = prepare(render_page(sample_lines(5), width=2480, exif_rotate=True), spec)
    assert turned.original_width == 2480


def test_grey_scan_stays_grey_for_a_vlm_and_is_padded_to_the_multiple_not_resampled() -> None:
    scan = a4_grey_jpeg(sample_lines(6))
    page = prepare_page(scan, VLM_SPEC, preview_side=600)
    assert page.image.data is not None
    sent = cv2.imdecode(np.frombuffer(page.image.data, np.uint8), cv2.IMREAD_UNCHANGED)
    assert sent.ndim == 2  # one channel: a grey scan is not blown up to three for the engine
    with Image.open(io.BytesIO(scan)) as im:
        assert (page.width, page.height) == im.size
    assert (page.image.width, page.image.height) == sent.shape[::-1]
    assert page.image.width % 32 == 0 and page.image.height % 32 == 0
    # Decoded at 1/2 in the DCT domain; the sides were rounded up by padding, so the page's pixels sit
    # unchanged in the top-left corner and map back to the page exactly.
    half = cv2.imdecode(np.frombuffer(scan, np.uint8), cv2.IMREAD_REDUCED_GRAYSCALE_2)
    h, w = half.shape
    assert 0 < page.image.width - w < 32 or page.image.width == w
    diff = np.abs(sent[:h, :w].astype(np.int16) - half.astype(np.int16)).mean()
    assert diff < 2.0, diff  # JPEG re-encoding noise only
    x, y = page.image.to_original((w, h))
    assert abs(x - page.width) <= 2 and abs(y - page.height) <= 2
    assert page.preview is not None and page.preview.ndim == 2 and max(page.preview.shape) == 600


def test_a_spec_asking_base64_gets_it_from_the_pool_and_others_do_not() -> None:
    """The vLLM server's client sends the page as a data URL: the pool makes its base64, not the feeding process."""
    scan = a4_grey_jpeg(sample_lines(3))
    plain = prepare_page(scan, VLM_SPEC)
    asked = prepare_page(scan, dataclasses.replace(VLM_SPEC, base64=True))
    assert plain.image.data is not None and plain.image.data_b64 is None
    assert asked.image.data is None  # the base64 only crosses to the feeding process
    assert asked.image.data_b64 is not None and base64.b64decode(asked.image.data_b64) == plain.image.data
    assert asked.image.encoded() == plain.image.encoded() == plain.image.data


def test_colour_scan_stays_colour_for_a_vlm() -> None:
    page = prepare_page(render_page(sample_lines(7), fmt="JPEG", width=2480), VLM_SPEC, preview_side=400)
    assert page.image.data is not None
    sent = cv2.imdecode(np.frombuffer(page.image.data, np.uint8), cv2.IMREAD_UNCHANGED)
    assert sent.ndim == 3
    assert page.preview is not None and page.preview.ndim == 2 and max(page.preview.shape) == 400


def test_a_page_opencv_refuses_gets_opencvs_reason() -> None:
    # The header is fine (2 MP, limit 150 MP); OpenCV's decoder raises instead of returning nothing.
    with pytest.raises(InputError, match=r"^cannot decode this image \(OpenCV: .*CV_IO_MAX_IMAGE_WIDTH\)$") as info:
        prepare(very_wide_tiff(), InputSpec(grayscale=True))
    assert info.value.stage == "preprocess" and not info.value.retryable


def test_an_extreme_strip_stays_within_max_side() -> None:
    buf = io.BytesIO()
    Image.new("L", (70000, 40), 200).save(buf, format="PNG")
    page = prepare(buf.getvalue(), VLM_SPEC)
    assert page.width <= 2048 and page.height % 32 == 0


# --- Pages of PDFs and multi-page TIFFs, and hostile images -------------------------------------------------


def pdf_pages(*sizes: tuple[float, float], box: tuple[int, float, float, float, float] | None = None) -> bytes:
    """A PDF of blank pages of ``sizes`` (points); ``box`` (page, left, top, width, height in points from
    the top-left corner) draws a black rectangle."""
    pdf = pdfium.PdfDocument.new()
    for i, (w, h) in enumerate(sizes, 1):
        page = pdf.new_page(w, h)
        if box is not None and box[0] == i:
            _, left, top, bw, bh = box
            rect = pdfium_c.FPDFPageObj_CreateNewRect(left, h - top - bh, bw, bh)  # PDF's origin: bottom left
            pdfium_c.FPDFPageObj_SetFillColor(rect, 0, 0, 0, 255)
            pdfium_c.FPDFPath_SetDrawMode(rect, pdfium_c.FPDF_FILLMODE_ALTERNATE, False)
            pdfium_c.FPDFPage_InsertObject(page, rect)
            pdfium_c.FPDFPage_GenerateContent(page)
    buf = io.BytesIO()
    pdf.save(buf)
    return buf.getvalue()


def handmade_pdf(*objects: bytes, trailer: bytes = b"") -> bytes:
    """A PDF of ``objects`` (numbered from 1; 1 is the catalog) with a correct cross-reference table:
    for what pypdfium2 cannot write (encryption, an image that only declares its size)."""
    out = bytearray(b"%PDF-1.7\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R %s >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, trailer, xref)
    return bytes(out)


ONE_PAGE = (b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>")


def _dark_box(img: np.ndarray) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of the dark pixels, right and bottom exclusive."""
    grey = img if img.ndim == 2 else cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)
    ys, xs = np.nonzero(grey < 128)
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


def test_a_pdf_page_is_rendered_once_at_the_engines_size_and_maps_to_300_dpi_pixels() -> None:
    # Page 2 is landscape A4 with a 50 x 80 pt box 100 pt from the left, 200 pt from the top.
    data = pdf_pages((595, 842), (842, 595), (300, 300), box=(2, 100, 200, 50, 80))
    page = prepare_page(data, VLM_SPEC, page=2, preview_side=500)
    assert (page.width, page.height) == (3508, 2479)  # the page's points x 300 / 72
    assert (page.image.width, page.image.height) == target_size(3508, 2479, VLM_SPEC) == (2048, 1440)
    assert page.image.data is not None
    sent = cv2.imdecode(np.frombuffer(page.image.data, np.uint8), cv2.IMREAD_UNCHANGED)
    assert sent is not None and sent.shape == (1440, 2048, 3)  # rendered at that size: not padded, not resized
    left, top, right, bottom = _dark_box(sent)
    x0, y0 = page.image.to_original((left, top))
    x1, y1 = page.image.to_original((right, bottom))
    dpi = 300 / 72
    for got, pt in ((x0, 100), (y0, 200), (x1, 150), (y1, 280)):
        assert abs(got - pt * dpi) <= 4, (got, pt * dpi)  # 1.7 original pixels per rendered pixel
    # The annotated image's preview comes from the same render, upright, the box where it is.
    assert page.preview is not None and page.preview.shape == (352, 500)
    pl, pt_, _, _ = _dark_box(page.preview)
    assert abs(pl - 100 * dpi * 500 / 3508) <= 2 and abs(pt_ - 200 * dpi * 352 / 2479) <= 2


def test_a_pdf_page_is_rendered_grey_for_a_grey_engine_and_never_above_300_dpi() -> None:
    data = pdf_pages((144, 72), box=(1, 10, 10, 20, 20))  # 2 x 1 inch: 600 x 300 pixels at 300 dpi
    page = prepare_page(data, InputSpec(max_side=2000, grayscale=True))
    assert (page.width, page.height) == (600, 300)
    assert page.image.pixels is not None and page.image.pixels.shape == (300, 600, 3)
    pixels = page.image.pixels
    assert (pixels[:, :, 0] == pixels[:, :, 2]).all()  # rendered grey
    for got, pt in zip(_dark_box(pixels), (10, 10, 30, 30), strict=True):
        assert abs(got - pt * 300 / 72) <= 1, (got, pt)  # at 300 dpi, not the 2000 px the engine allows


def test_a_200_inch_pdf_page_is_rendered_at_the_engines_size_not_at_its_own() -> None:
    data = pdf_pages((14400, 14400))  # 200 x 200 inches: 5 GB at 200 dpi
    t0 = time.perf_counter()
    page = prepare_page(data, VLM_SPEC, Limits(max_pixels=5_000_000), preview_side=300)
    assert time.perf_counter() - t0 < 5.0  # about 30 ms; rendering it whole first took minutes, or memory
    assert (page.width, page.height) == (60000, 60000)
    assert (page.image.width, page.image.height) == (2048, 2048)
    assert page.image.to_original((2048, 2048)) == (60000.0, 60000.0)


def test_a_pdf_page_too_large_even_at_the_engines_size_is_refused_before_rendering() -> None:
    with pytest.raises(InputError, match=r"^PDF page 1 too large to render \(20000x20000 = 400 MP at the engine's "
                                         r"size, limit 100 MP\)$"):
        prepare(pdf_pages((14400, 14400)), InputSpec(max_side=20000), Limits(max_pixels=100_000_000))


@pytest.mark.parametrize("in_form", [False, True], ids=["on the page", "in a form xobject"])
def test_a_pdf_page_holding_a_huge_image_is_refused_before_pdfium_decodes_it(in_form: bool) -> None:
    # A page whose image declares 40000 x 40000 pixels: PDFium would decode it whole (1.6 GB) to draw it small.
    image = (b"<< /Type /XObject /Subtype /Image /Width 40000 /Height 40000 /ColorSpace /DeviceGray "
             b"/BitsPerComponent 8 /Length 4 >>\nstream\n\x00\x00\x00\x00\nendstream")
    draw = b"q 595 0 0 842 0 0 cm /Im1 Do Q"
    form = (b"<< /Type /XObject /Subtype /Form /BBox [0 0 595 842] /Resources << /XObject << /Im1 6 0 R >> >> "
            b"/Length %d >>\nstream\n%s\nendstream" % (len(draw), draw))
    content = b"/Fm1 Do" if in_form else draw
    data = handmade_pdf(
        *ONE_PAGE,
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Contents 4 0 R "
        b"/Resources << /XObject << %s >> >> >>" % (b"/Fm1 5 0 R" if in_form else b"/Im1 6 0 R"),
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content),
        form,
        image,
    )
    with pytest.raises(InputError, match=r"^PDF page 1 holds an image too large \(40000x40000 = 1600 MP, "
                                         r"limit 150 MP\)$"):
        prepare(data, VLM_SPEC)


@pytest.mark.parametrize(("page", "reason"), [
    (3, r"no page 3 in this PDF \(2 pages\)"),
    (0, r"no page 0 \(pages are numbered from 1\)"),
])
def test_a_page_the_pdf_does_not_have_is_refused(page: int, reason: str) -> None:
    with pytest.raises(InputError, match=f"^{reason}$") as info:
        prepare_page(pdf_pages((595, 842), (595, 842)), VLM_SPEC, page=page)
    assert info.value.stage == "preprocess" and not info.value.retryable


def test_an_encrypted_pdf_is_named_as_such() -> None:
    # Encrypted with a user password we do not have (the standard security handler, 40-bit RC4).
    encrypt = b"<< /Filter /Standard /V 1 /R 2 /P -4 /O <%s> /U <%s> >>" % (b"11" * 32, b"22" * 32)
    data = handmade_pdf(*ONE_PAGE, b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] >>", encrypt,
                        trailer=b"/Encrypt 4 0 R /ID [<%s> <%s>]" % (b"33" * 16, b"33" * 16))
    with pytest.raises(InputError, match=r"^encrypted PDF \(password required\)$"):
        prepare(data, VLM_SPEC)
    # The same document without its /Encrypt opens: the password is what it lacks.
    assert prepare(handmade_pdf(*ONE_PAGE, b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] >>"),
                   VLM_SPEC).width == 1440


def test_an_unreadable_pdf_says_so() -> None:
    with pytest.raises(InputError, match=r"^unreadable PDF \(PDFium: Data format error\)$"):
        prepare(b"%PDF-1.4 nothing else", VLM_SPEC)


def three_frame_tiff(sizes: tuple[tuple[int, int], ...] = ((100, 80), (110, 90), (120, 100))) -> bytes:
    """A multi-page TIFF whose frame i (from 1) is a flat grey of value 40 * i."""
    frames = [Image.new("L", size, 40 * i) for i, size in enumerate(sizes, 1)]
    buf = io.BytesIO()
    frames[0].save(buf, format="TIFF", save_all=True, append_images=frames[1:], compression="tiff_deflate")
    return buf.getvalue()


def declare_frame_size(tiff: bytes, frame: int, width: int, height: int) -> bytes:
    """``tiff`` (little-endian) with frame ``frame``'s header declaring width x height: a bomb's shape."""
    data = bytearray(tiff)
    ifd = struct.unpack_from("<I", data, 4)[0]
    for _ in range(frame - 1):
        ifd = struct.unpack_from("<I", data, ifd + 2 + 12 * struct.unpack_from("<H", data, ifd)[0])[0]
    for i in range(struct.unpack_from("<H", data, ifd)[0]):
        entry = ifd + 2 + 12 * i
        tag, kind = struct.unpack_from("<HH", data, entry)
        if tag in (256, 257):  # ImageWidth, ImageLength
            struct.pack_into("<H" if kind == 3 else "<I", data, entry + 8, width if tag == 256 else height)
    return bytes(data)


def test_a_frame_of_a_multi_page_tiff_is_decoded_on_its_own() -> None:
    page = prepare_page(three_frame_tiff(), InputSpec(grayscale=True), page=3, preview_side=60)
    assert (page.width, page.height) == (120, 100)
    assert page.image.pixels is not None and page.image.pixels.shape == (100, 120, 3)
    assert (page.image.pixels == 120).all()
    assert page.preview is not None and page.preview.shape == (50, 60)
    first = prepare_page(three_frame_tiff(), InputSpec(grayscale=True), page=1)  # OpenCV's path
    assert (first.width, first.height) == (100, 80) and first.image.pixels is not None
    assert (first.image.pixels == 40).all()
    with pytest.raises(InputError, match=r"^no page 4 in this TIFF \(3 pages\)$"):
        prepare_page(three_frame_tiff(), InputSpec(), page=4)


def test_a_bomb_frame_is_refused_from_its_header_and_spoils_no_other_page() -> None:
    tiff = declare_frame_size(three_frame_tiff(), 2, 40000, 40000)
    with pytest.raises(InputError, match=r"^TIFF page 2 too large \(40000x40000 = 1600 MP, limit 150 MP\)$"):
        prepare_page(tiff, InputSpec(), page=2)
    assert prepare_page(tiff, InputSpec(), page=3).width == 120
    assert prepare_page(tiff, InputSpec(), page=1).width == 100
    # A bomb first frame is beyond Pillow's own guard (DecompressionBombError): its page is refused
    # with our line, and the pages after it are still read.
    tiff = declare_frame_size(three_frame_tiff(), 1, 40000, 40000)
    with pytest.raises(InputError, match=r"^image too large \(1600 MP, limit 150 MP\)$"):
        prepare_page(tiff, InputSpec(), page=1)
    assert prepare_page(tiff, InputSpec(), page=2).width == 110


def test_a_plain_image_has_page_1_only() -> None:
    with pytest.raises(InputError, match=r"^no page 2 in a JPEG image \(it has one page\)$"):
        prepare_page(render_page(sample_lines(8), fmt="JPEG"), InputSpec(), page=2)


def test_a_jpeg_with_data_after_its_end_decodes_like_the_jpeg_alone() -> None:
    # A motion photo: the JPEG, then a video (whose bytes may hold FF D9 anywhere).
    jpeg = render_page(sample_lines(9), fmt="JPEG")
    video = b"\x00\x00\x00\x18ftypmp42" + np.random.default_rng(9).integers(0, 256, 200_000, np.uint8).tobytes()
    alone, motion = prepare(jpeg, InputSpec()), prepare(jpeg + video, InputSpec())
    assert alone.pixels is not None and motion.pixels is not None
    assert np.array_equal(alone.pixels, motion.pixels)


def test_a_truncated_jpeg_is_refused_though_a_segment_before_its_scan_holds_an_end_marker() -> None:
    img = Image.open(io.BytesIO(render_page(sample_lines(10)))).convert("RGB")
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=92, comment=b"thumbnail \xff\xd9 inside")  # as an EXIF thumbnail's EOI
    data = buf.getvalue()
    assert prepare(data, InputSpec()).pixels is not None
    with pytest.raises(InputError, match="truncated JPEG"):
        prepare(data[: len(data) * 2 // 3], InputSpec())


def _asymmetric(mode: str) -> Image.Image:
    """60 x 40, white with a black block in the top-left corner and a grey one on the right edge; in
    RGBA, a transparent red block as well (white once composited)."""
    img = Image.new("RGB", (60, 40), "white")
    img.paste((0, 0, 0), (0, 0, 15, 10))
    img.paste((128, 128, 128), (50, 15, 60, 25))
    if mode == "P":
        return img.convert("P", palette=Image.Palette.ADAPTIVE, colors=4)
    img = img.convert("RGBA")
    img.paste((255, 0, 0, 0), (20, 30, 30, 40))
    return img


@pytest.mark.parametrize("orientation", range(2, 9))
@pytest.mark.parametrize(("fmt", "mode"), [("PNG", "RGBA"), ("PNG", "P"), ("WEBP", "RGBA")])
def test_exif_orientation_is_applied_to_images_with_alpha_or_a_palette(fmt: str, mode: str, orientation: int) -> None:
    img = _asymmetric(mode)
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    img.save(buf, format=fmt, exif=exif, **({"lossless": True} if fmt == "WEBP" else {}))
    upright = ImageOps.exif_transpose(Image.open(buf)).convert("RGBA")
    on_white = Image.alpha_composite(Image.new("RGBA", upright.size, "white"), upright).convert("RGB")
    expected = cv2.cvtColor(np.asarray(on_white), cv2.COLOR_RGB2BGR)
    page = prepare_page(buf.getvalue(), InputSpec())
    assert page.image.pixels is not None and (page.width, page.height) == expected.shape[1::-1]
    assert np.array_equal(page.image.pixels, expected)


@pytest.mark.parametrize("size", [(2048, 1), (1, 2048), (2048, 1536), (1537, 2047)])
def test_the_preview_of_any_page_fits_its_side(size: tuple[int, int]) -> None:
    img = np.full((size[1], size[0]), 200, np.uint8)
    preview = grey_preview(img, 1000)
    assert max(preview.shape) in (999, 1000) and min(preview.shape) >= 1 and (preview == 200).all()
