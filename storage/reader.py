"""An object of the store read as a file: ranged reads in blocks, a few blocks kept.

PDFium reads a document through a file object on demand (``pypdfium2.PdfDocument(reader)``): the
trailer and cross-reference table first, then the objects of the page it draws. Over the object
store, each read that misses the block cache is one ranged GET (S3 ``Range: bytes=...``, a seek
and a read for the folder store) of the blocks it needs, so a page of a 100 MB PDF costs its own
objects and the cross-reference table, not the file. Blocks are small (4 KiB: PDFium reads objects
scattered over the file, one page dictionary per page before it in a flat page tree), and reads that
follow on from the last one fetch ahead, twice as far each time up to 64 blocks, so a table read
from start to end costs a few requests. At most ``cache_blocks`` blocks are kept (least recently
used dropped), so an open reader holds ``block_size * cache_blocks`` bytes at most.

Reading by range pays a request per scattered read: opening page 9,000 of a PDF whose page tree is
flat reads 9,000 page dictionaries, one request each. Past ``max_requests`` requests, the reader
stops paying that: it fetches the object whole, once, into a temporary file it then
reads from (deleted with the reader). A page then never costs more than about one download of its
document, and a document read by range stays so as long as its pages are cheap.

A read the store refuses reads nothing (0 bytes) and keeps the store's error on the reader
(``error``): PDFium calls ``readinto`` from C, where an exception could only be printed, and sees
that the read failed; the caller then asks the reader why.
"""

from __future__ import annotations

import io
import mmap
import os
import tempfile
import threading
from collections import OrderedDict

from paperlane.errors import PaperlaneError, StorageUnavailable
from paperlane.storage.objects import ObjectStore, ranged, split_range


class ObjectReader(io.RawIOBase):
    """A read-only, seekable file over the object ``key`` of ``store`` (see the module docstring).

    ``size``: the object's size when the caller knows it (else one ``store.size`` call). Thread-safe.
    """

    def __init__(self, store: ObjectStore, key: str, *, size: int | None = None, block_size: int = 4096,
                 cache_blocks: int = 256, max_ahead: int = 64, max_requests: int = 256) -> None:
        super().__init__()
        self._store, self._block, self._keep = store, block_size, max(1, cache_blocks)
        base, span = split_range(key)
        self._key, self._offset = base, span[0] if span else 0
        self._size = size if size is not None else store.size(key)
        self._pos = 0
        self._max_ahead, self._ahead, self._after_last = max(1, max_ahead), 1, -1  # read-ahead, in blocks
        self._blocks: OrderedDict[int, bytes] = OrderedDict()  # block number -> bytes, least recently used first
        self._max_requests = max_requests
        self._local: int | None = None  # the descriptor of the whole object's local copy, once fetched
        self._lock = threading.Lock()
        self.fetched = 0  # bytes read from the store
        self.requests = 0  # ranged reads sent to the store
        self.error: PaperlaneError | None = None  # the store's last refusal, for a caller PDFium only told "failed"

    @property
    def size(self) -> int:
        return self._size

    @property
    def capacity(self) -> int:
        """The most bytes this reader keeps."""
        return self._block * self._keep

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]  # what io passes it
        view = memoryview(buffer).cast("B")
        end = min(self._size, self._pos + len(view))
        if end <= self._pos:
            return 0
        with self._lock:
            first, last = self._pos // self._block, (end - 1) // self._block
            try:
                if self._local is None and self.requests >= self._max_requests:
                    self._fetch_whole()
                if self._local is not None:
                    return self._read_local(view, end)
                blocks = self._get(first, last)
            except PaperlaneError:
                return 0  # self.error says why
        data = b"".join(blocks)
        start = self._pos - first * self._block
        n = end - self._pos
        view[:n] = data[start:start + n]
        self._pos = end
        return n

    def _get(self, first: int, last: int) -> list[bytes]:
        """Blocks first..last, each missing run of them fetched with one ranged read."""
        found: dict[int, bytes] = {}
        number = first
        while number <= last:
            if number in self._blocks:
                self._blocks.move_to_end(number)
                found[number] = self._blocks[number]
                number += 1
                continue
            # Reading on from where the last fetch ended: fetch ahead, further each time.
            self._ahead = min(2 * self._ahead, self._max_ahead) if number == self._after_last else 1
            final = (self._size - 1) // self._block
            run_end = number
            while run_end < final and run_end + 1 not in self._blocks and (
                    run_end + 1 <= last or run_end + 1 < number + self._ahead):
                run_end += 1
            self._after_last = run_end + 1
            start, stop = number * self._block, min(self._size, (run_end + 1) * self._block)
            try:
                data = self._store.get(ranged(self._key, self._offset + start, self._offset + stop))
            except PaperlaneError as exc:
                self.error = exc
                raise
            if len(data) != stop - start:
                self.error = StorageUnavailable(f"short read of {self._key} ({len(data)} of {stop - start} bytes)",
                                                stage="store")
                raise self.error
            self.fetched += len(data)
            self.requests += 1
            for i in range(number, run_end + 1):
                found[i] = data[(i - number) * self._block:(i - number + 1) * self._block]
                self._blocks[i] = found[i]
            number = run_end + 1
        while len(self._blocks) > self._keep:
            self._blocks.popitem(last=False)
        return [found[i] for i in range(first, last + 1)]

    def _fetch_whole(self) -> None:
        """The object, whole, into a temporary file that later reads come from."""
        try:
            data = self._store.get(ranged(self._key, self._offset, self._offset + self._size))
        except PaperlaneError as exc:
            self.error = exc
            raise
        self.fetched += len(data)
        self.requests += 1
        fd, path = tempfile.mkstemp(prefix="paperlane-object-")
        os.unlink(path)  # gone from the folder now; gone from the disk when the reader closes it
        with os.fdopen(os.dup(fd), "wb") as fh:
            fh.write(data)
        self._local = fd

    def _read_local(self, view: memoryview, end: int) -> int:
        assert self._local is not None
        data = os.pread(self._local, end - self._pos, self._pos)
        view[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def close(self) -> None:
        if self._local is not None:
            os.close(self._local)
            self._local = None
        super().close()

    def runs(self) -> list[bytes | mmap.mmap]:
        """The bytes kept now, as runs of consecutive blocks (each a contiguous piece of the object); once the
        object was fetched whole, all of it (mapped)."""
        with self._lock:
            if self._local is not None:
                return [mmap.mmap(self._local, 0, access=mmap.ACCESS_READ)] if self._size else []
            runs: list[list[bytes]] = []
            previous = -2
            for number in sorted(self._blocks):
                if number == previous + 1:
                    runs[-1].append(self._blocks[number])
                else:
                    runs.append([self._blocks[number]])
                previous = number
            return [b"".join(run) for run in runs]  # joined once (adding block by block was quadratic)
