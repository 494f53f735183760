"""What a page may cost before any pixel memory is allocated: the file's bytes and the pixels it declares.

An original larger than ``Limits.max_bytes``, or an image (a TIFF frame, a PDF page's image) declaring more than
``Limits.max_pixels``, is refused from its header with an ``InputError``: a 40000x40000 image declared in a 1 kB
file must not take 4.8 GB to refuse.
"""

from __future__ import annotations

from dataclasses import dataclass

from paperlane.errors import InputError
from paperlane.schemas import Stage

_STAGE = Stage.PREPROCESS.value


@dataclass(frozen=True)
class Limits:
    max_pixels: int = 150_000_000
    max_bytes: int = 200 * 1024 * 1024


def check_file_size(data: bytes, limits: Limits) -> None:
    """Refuse an empty file, or one larger than ``limits.max_bytes``."""
    if not data:
        raise InputError("empty file (0 bytes)", stage=_STAGE)
    if len(data) > limits.max_bytes:
        raise InputError(f"file too large ({len(data) / 2**20:.0f} MiB, limit {limits.max_bytes / 2**20:.0f} MiB)",
                         stage=_STAGE)


def check_pixels(w: int, h: int, limits: Limits, *, what: str) -> None:
    if w < 1 or h < 1:
        raise InputError(f"{what} has no pixels ({w}x{h})", stage=_STAGE)
    if w * h > limits.max_pixels:
        raise InputError(f"{what} too large ({w}x{h} = {w * h / 1e6:.0f} MP, limit {limits.max_pixels / 1e6:.0f} MP)",
                         stage=_STAGE)
