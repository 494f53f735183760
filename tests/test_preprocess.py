"""Preprocessing: every unreadable page gets a clear reason; good pages get exactly the spec."""

from __future__ import annotations

import io

import cv2
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from paperlane.errors import InputError
from paperlane.models.engine import InputSpec
from paperlane.workers.preprocess import Limits, prepare, prepare_page, target_size
from tests.pages import BAD_INPUTS, huge_declared_png, render_page, sample_lines, truncated_jpeg

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
