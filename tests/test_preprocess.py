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
from paperlane.workers.preprocess import Limits, prepare, target_size
from tests.pages import BAD_INPUTS, huge_declared_png, render_page, sample_lines, truncated_jpeg


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


@given(w=st.integers(1, 30000), h=st.integers(1, 30000), m=st.sampled_from([1, 28, 32]))
def test_target_size_respects_the_spec(w: int, h: int, m: int) -> None:
    spec = InputSpec(max_side=2048, max_pixels=2048 * 2048, min_pixels=512 * 512, multiple_of=m)
    tw, th = target_size(w, h, spec)
    assert tw % m == 0 and th % m == 0
    assert tw * th <= 2048 * 2048
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
