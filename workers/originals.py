"""Originals a worker's preprocessing has just read from the object store, kept on its disk for the outputs it builds.

An image's document ends with its one page, and the document's searchable PDF embeds its original: the process
building the outputs read that original from the store again, seconds after a preprocessing process had read it
(for an A4 300 dpi scan, a GET of ~1 MB a page: the worker's CPU, the store's, the network's). So a worker that
builds its documents' outputs (``worker.write_outputs``, on an S3 store) gives its preprocessing processes a folder
of its own (``workers.scratch``), ``KeptOriginals``, where each leaves the originals it reads whole, and its outputs
writer reads through ``KeptFirst``: an original kept there is read and removed; anything else comes from the store.

Keys of originals are content-addressed, so a kept copy is the stored one, never stale; each copy is written under
a temporary name and renamed, so a reader finds it whole or not at all. Copies nobody takes (a page that failed, a
document whose outputs another worker wrote) are bounded: past ``max_files``, the oldest are removed. Keeping is
best effort: a copy that cannot be written (a full disk) is skipped, and its outputs read the store as before.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path

from paperlane.storage.objects import DelegatingStore, ObjectStore

log = logging.getLogger(__name__)

FOLDER_PREFIX = "paperlane-originals-"
_TRIM_EVERY = 32  # copies kept by one process between two looks at the folder's size


class KeptOriginals:
    """The folder ``folder`` of originals by key; one object per process, every process on the same folder."""

    def __init__(self, folder: Path, *, max_files: int = 256) -> None:
        self.folder = folder
        self.max_files = max_files
        self._kept = 0

    def keep(self, key: str, data: bytes) -> None:
        """Leave a copy of the original ``key`` (``data``, as the store holds it). Never raises."""
        path = self._path(key)
        # Its writer's own temporary name: pages prepared on threads share a process.
        tmp = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except OSError as exc:
            log.debug("original %s not kept: %s", key, exc)
            tmp.unlink(missing_ok=True)
            return
        self._kept += 1
        if self._kept % _TRIM_EVERY == 0:
            self.trim()

    def take(self, key: str) -> bytes | None:
        """The copy of the original ``key``, removed; None when there is none."""
        path = self._path(key)
        try:
            data = path.read_bytes()
        except OSError:  # none kept (or it went between the lookup and the read)
            return None
        path.unlink(missing_ok=True)
        return data

    def trim(self) -> None:
        """Remove the oldest copies beyond ``max_files`` (copies being written are not counted)."""
        try:
            copies = [(entry.stat().st_mtime, entry.path) for entry in os.scandir(self.folder)
                      if "." not in entry.name]
        except OSError:
            return
        copies.sort()
        for _, path in copies[: max(0, len(copies) - self.max_files)]:
            Path(path).unlink(missing_ok=True)

    def _path(self, key: str) -> Path:
        return self.folder / hashlib.sha1(key.encode()).hexdigest()


class KeptFirst(DelegatingStore):
    """``store``, except that an original kept in ``kept`` is read from there (once) instead."""

    def __init__(self, store: ObjectStore, kept: KeptOriginals) -> None:
        super().__init__(store)
        self.kept = kept

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        data = self.kept.take(key)
        if data is not None and (max_bytes is None or len(data) <= max_bytes):
            return data
        return self.store.get(key, max_bytes=max_bytes)
