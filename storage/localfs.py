"""A local folder as object store: the embedded default."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from paperlane.errors import ObjectNotFound, StorageUnavailable
from paperlane.storage.objects import split_range, too_large


class LocalStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root.resolve() not in path.parents:
            raise ValueError(f"object key escapes the store: {key!r}")
        return path

    def put(self, key: str, data: bytes, *, content_type: str = "application/octet-stream") -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Write then rename, so a reader never sees half an object.
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            raise StorageUnavailable(f"cannot write {key}: {exc.strerror}", stage="store") from exc

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        base, span = split_range(key)
        if max_bytes is not None and (size := self.size(key)) > max_bytes:
            raise too_large(key, size, max_bytes)
        try:
            if span is None:
                return self._path(base).read_bytes()
            with self._path(base).open("rb") as fh:
                fh.seek(span[0])
                return fh.read(span[1] - span[0])
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"object {key} not found") from exc
        except OSError as exc:
            raise StorageUnavailable(f"cannot read {key}: {exc.strerror}") from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        base, span = split_range(key)
        if span is not None:
            return span[1] - span[0]
        try:
            return self._path(base).stat().st_size
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"object {key} not found") from exc
        except OSError as exc:
            raise StorageUnavailable(f"cannot read {key}: {exc.strerror}") from exc

    def url(self, key: str) -> str:
        return str(self._path(key))
