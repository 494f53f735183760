"""Archives that cost far more to read than to send, made streaming (never whole in memory)."""

from __future__ import annotations

import struct
import tarfile
import zlib
from pathlib import Path

MiB = 1 << 20


def zeros_tar_gz(path: Path, size: int, name: str = "zeros.tif") -> Path:
    """A valid .tar.gz of one member of ``size`` zero bytes: about 1,000 times smaller than it inflates. Each MiB of
    zeros is deflated once after a full flush, so the same compressed block stands for every MiB (4 GiB in a
    second)."""
    info = tarfile.TarInfo(name)
    info.size = size
    header = info.tobuf(format=tarfile.GNU_FORMAT)
    block = bytes(MiB)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    blocks, rest = divmod(size + 1024, MiB)  # the member, its padding and the archive's end: all zeros
    crc = zlib.crc32(header)
    with path.open("wb") as fh:
        fh.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff")  # gzip, deflate, no name, no time
        fh.write(deflate.compress(header) + deflate.flush(zlib.Z_FULL_FLUSH))
        segment = b""
        for i in range(blocks):
            if i < 2:  # the first block after a flush compresses as every later one does
                segment = deflate.compress(block) + deflate.flush(zlib.Z_FULL_FLUSH)
            fh.write(segment)
            crc = zlib.crc32(block, crc)
        fh.write(deflate.compress(bytes(rest)) + deflate.flush())
        crc = zlib.crc32(bytes(rest), crc)
        fh.write(struct.pack("<II", crc, (len(header) + size + 1024) & 0xFFFFFFFF))
    return path
