"""A worker's own folder in the temp folder (``TMPDIR``), and the removal of those whose worker is gone.

A worker keeps files of its own beside its pages: copies of PDFs (``doccache.Spool``, up to a gigabyte) and the
previews of pages in flight (``previews``). It removes its folder when it stops; a worker killed cannot, and on a
Kubernetes node the GPU worker's /tmp is an emptyDir that outlives the container. So each folder is locked by the
process that made it for its life (the kernel lets the lock go when that process dies, however it dies), and the
next folder of the same kind made on the host removes every one whose lock is free.
"""

from __future__ import annotations

import fcntl
import logging
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

_LOCK = ".lock"


class ScratchFolder:
    """A folder named ``prefix``..., locked while this object is open; made after removing the dead ones."""

    def __init__(self, prefix: str) -> None:
        _remove_dead_folders(Path(tempfile.gettempdir()), prefix)
        self.path = Path(tempfile.mkdtemp(prefix=prefix))
        self._lock = open(self.path / _LOCK, "w")  # noqa: SIM115 (held open for the folder's life)
        fcntl.flock(self._lock, fcntl.LOCK_EX)

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self._lock.close()


def _remove_dead_folders(parent: Path, prefix: str) -> None:
    """Remove the folders ``prefix``... under ``parent`` whose maker is gone: their lock is free. A folder without
    its lock file yet (one being made this instant) is left alone."""
    for folder in parent.glob(prefix + "*"):
        try:
            with open(folder / _LOCK) as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(folder, ignore_errors=True)
                log.info("removed %s, left by a worker that did not stop", folder)
        except OSError:  # held (its maker lives), no lock file, or not ours to read
            continue
