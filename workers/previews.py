"""A page's preview left in a file by the pool process that cut it, for the one that draws on it.

The preview (grey, ``worker.annotated_max_side`` px: 700 kB for an A4 page) is cut in a pool process when the page
is prepared and drawn on in a pool process after inference (``page_store``). Through the pools' pipes it went to
the process feeding the engine and back, pickled and copied on both sides of each trip: 2.3 ms of CPU a page, a
twenty-fifth of a worker's. Written to a file of the worker's own folder instead and read back where it is drawn
on, it costs 0.4 ms and the feeding process carries a file name. The page's attempt removes the file when it ends
(``pipeline``), whatever happened; the folder (``PreviewFolder``, in ``TMPDIR``) goes when the pool closes. A worker
killed cannot remove its own: the next pool to start on the host removes every folder whose pool is gone (each
pool holds a lock on its folder for its life, which the kernel lets go when its process dies, however it dies).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import uuid
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

_PREFIX = "paperlane-previews-"
_LOCK = ".lock"


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


class PreviewFolder:
    """A pool's folder for its previews, locked while the pool lives; made after removing dead pools' folders."""

    def __init__(self) -> None:
        _remove_dead_folders(Path(tempfile.gettempdir()))
        self.path = Path(tempfile.mkdtemp(prefix=_PREFIX))
        self._lock = open(self.path / _LOCK, "w")  # noqa: SIM115 (held open for the pool's life)
        fcntl.flock(self._lock, fcntl.LOCK_EX)

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self._lock.close()


def _remove_dead_folders(parent: Path) -> None:
    """Remove the preview folders under ``parent`` whose pool is gone: their lock is free. A folder without its
    lock file yet (a pool making it this instant) is left alone."""
    for folder in parent.glob(_PREFIX + "*"):
        try:
            with open(folder / _LOCK) as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(folder, ignore_errors=True)
                log.info("removed %s, left by a worker that did not stop", folder)
        except OSError:  # held (its pool lives), no lock file, or not ours to read
            continue
