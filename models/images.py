"""Prepared page bytes -> the image objects that local model runtimes take."""

from __future__ import annotations

import io

from PIL import Image

from paperlane.errors import EngineError
from paperlane.models.engine import PreparedImage


def to_pil(image: PreparedImage) -> Image.Image:
    """The prepared page as an RGB PIL image (local runtimes' processors take PIL images)."""
    if image.data is None:
        raise EngineError("the engine needs an encoded image", stage="inference")
    with Image.open(io.BytesIO(image.data)) as im:
        return im.convert("RGB")
