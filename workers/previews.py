"""A page's preview left in a file by the pool process that cut it, for the one that draws on it.

The preview (grey, ``worker.annotated_max_side`` px: 700 kB for an A4 page) is cut in a pool process when the page
is prepared and drawn on in a pool process after inference (``page_store``). Through the pools' pipes it went to
the process feeding the engine and back, pickled and copied on both sides of each trip: 2.3 ms of CPU a page, a
twenty-fifth of a worker's. Written to a file of the worker's own folder instead and read back where it is drawn
on, it costs 0.4 ms and the feeding process carries a file name. The page's attempt removes the file when it ends
(``pipeline``), whatever happened; the folder (``FOLDER_PREFIX``, a ``scratch.ScratchFolder``) goes when the pool
closes, or, a worker killed, when the next pool starts on the host.
"""

from __future__ import annotations

import os
import uuid
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FOLDER_PREFIX = "paperlane-previews-"


@dataclass(frozen=True)
class SpooledPreview:
    """A preview in ``path``: its raw pixels, ``shape`` (grey, uint8)."""

    path: str
    shape: tuple[int, ...]

    @classmethod
    def write(cls, folder: Path, preview: np.ndarray) -> SpooledPreview:
        path = folder / f"{uuid.uuid4().hex}.raw"
        with open(path, "wb") as f:
            f.write(np.ascontiguousarray(preview, np.uint8).data)
        return cls(str(path), tuple(preview.shape))

    def load(self) -> np.ndarray:
        """The pixels. Raises OSError when the file is gone (its page's attempt ended) or short."""
        pixels = np.fromfile(self.path, np.uint8)
        if pixels.size != int(np.prod(self.shape)):
            raise OSError(f"preview file {self.path} holds {pixels.size} bytes, not {int(np.prod(self.shape))}")
        return pixels.reshape(self.shape)

    def discard(self) -> None:
        with suppress(FileNotFoundError):
            os.unlink(self.path)
