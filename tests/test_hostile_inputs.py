"""Hostile inputs: each is one item's refusal (or a correct result) while the rest goes on, in bounded memory.

Every test puts a good document after the hostile one and checks that it still comes out.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tarfile
import time
import tracemalloc
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from PIL import Image

from paperlane.errors import InputError
from paperlane.models.engine import InputSpec
from paperlane.producer.input_items import Document, Inflation, Skipped
from paperlane.producer.inputs import expand
from paperlane.settings import IngestSettings
from tests.bombs import zeros_tar_gz
from tests.test_inputs import documents, jpeg, pdf_bytes, refusals, tar_bytes, zip_bytes

LIMITS = IngestSettings()
MiB = 1 << 20


def good(tmp_path: Path) -> Path:
    path = tmp_path / "good-after.jpg"
    path.write_bytes(jpeg(99))
    return path


def assert_good_after(items: list[Document | Skipped]) -> None:
    last = documents(items)[-1]
    assert (last.name, last.error, last.page_count) == ("good-after", None, 1)


def lines(items: list[Document | Skipped], root: Path) -> dict[str, str]:
    """Refusals by source relative to ``root``."""
    return {k.removeprefix(f"{root}/"): v for k, v in refusals(items).items()}


def traced_peak(run: Callable[[], list[Document | Skipped]]) -> tuple[list[Document | Skipped], int]:
    """What ``run`` returns and the most memory Python held meanwhile (every bytes object read is traced)."""
    tracemalloc.start()
    try:
        return run(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


MEASURE = """
import json, resource, sys
import pypdfium2, PIL.TiffImagePlugin  # loaded before the baseline
from paperlane.producer.input_items import Document
from paperlane.producer.inputs import expand
from paperlane.settings import IngestSettings

before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = [[d.name, d.page_count, d.error and str(d.error)] for d in expand(sys.argv[1:], IngestSettings())
       if isinstance(d, Document)]
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"grown_mib": grown / 1024, "documents": out}))
"""


def expand_in_child(*paths: Path) -> tuple[float, list[list[object]]]:
    """Expand ``paths`` in a fresh process: how much its peak RSS grew (MiB), and (name, pages, error) per document."""
    proc = subprocess.run([sys.executable, "-c", MEASURE, *map(str, paths)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    return result["grown_mib"], result["documents"]


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail instead of hanging: an open() that blocks is interrupted by SIGALRM."""
    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"still blocked after {seconds}s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def tiff_declaring(sizes: list[tuple[int, int]]) -> bytes:
    """A TIFF whose frames declare these sizes over 16 bytes of pixel data: a decompression bomb's shape."""
    out = bytearray(b"II*\x00" + struct.pack("<I", 8))
    for i, (width, height) in enumerate(sizes):
        # (tag, type, value): width, height, 1 bit per sample, uncompressed, white is zero, one strip of 16 bytes
        tags = [(256, 4, width), (257, 4, height), (258, 3, 1), (259, 3, 1), (262, 3, 0), (273, 4, 8),
                (278, 4, height), (279, 4, 16)]
        following = len(out) + 2 + 12 * len(tags) + 4
        out += struct.pack("<H", len(tags))
        out += b"".join(struct.pack("<HHII", tag, kind, 1, value) for tag, kind, value in tags)
        out += struct.pack("<I", following if i < len(sizes) - 1 else 0)
    return bytes(out)


def test_tiff_frame_of_billions_of_pixels_is_counted_without_decoding(tmp_path: Path) -> None:
    bomb = tiff_declaring([(100_000, 100_000)])
    with pytest.raises(Image.DecompressionBombError):
        Image.open(io.BytesIO(bomb))  # what the old splitter met
    (tmp_path / "bomb.tif").write_bytes(bomb)
    (tmp_path / "second-frame-bomb.tif").write_bytes(tiff_declaring([(100, 80), (100_000, 100_000), (100, 80)]))

    items = list(expand([tmp_path / "bomb.tif", tmp_path / "second-frame-bomb.tif", good(tmp_path)], LIMITS))
    assert [(d.name, d.page_count, d.error) for d in documents(items)[:2]] == [
        ("bomb", 1, None), ("second-frame-bomb", 3, None)]  # the worker refuses the frame by its pixel limit
    assert_good_after(items)


def set_zip_flag(data: bytes, name: str, flag: int) -> bytes:
    """``data`` with ``flag`` set on member ``name`` in its local header and its central directory entry."""
    out = bytearray(data)
    for signature, flag_at, name_at in ((b"PK\x03\x04", 6, 30), (b"PK\x01\x02", 8, 46)):
        at = out.find(signature)
        while at >= 0:
            if out[at + name_at:at + name_at + len(name)] == name.encode():
                out[at + flag_at] |= flag
            at = out.find(signature, at + 1)
    return bytes(out)


def test_encrypted_bad_crc_and_corrupt_zip_members_are_refused_one_by_one(tmp_path: Path) -> None:
    victim = jpeg(3) + b"CRC-victim" * 100
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("1.jpg", jpeg(1))
        zf.writestr("2-encrypted.jpg", jpeg(2))
        zf.writestr("3-bad-crc.jpg", victim)
        zf.writestr("4-corrupt.jpg", jpeg(4) * 3, compress_type=zipfile.ZIP_DEFLATED)
        zf.writestr("5.jpg", jpeg(5))
    data = bytearray(set_zip_flag(buf.getvalue(), "2-encrypted.jpg", 0x1))
    data[data.find(b"CRC-victim")] ^= 0x1
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as zf:
        info = zf.getinfo("4-corrupt.jpg")
    start = info.header_offset + 30 + len(info.filename)  # no extra field: zipfile wrote none
    data[start:start + 64] = b"\xff" * 64
    (tmp_path / "hostile.zip").write_bytes(bytes(data))
    (tmp_path / "not-a.zip").write_bytes(b"PK\x03\x04" + bytes(200))

    items = list(expand([tmp_path / "hostile.zip", tmp_path / "not-a.zip", good(tmp_path)], LIMITS))
    assert lines(items, tmp_path) == {
        "hostile.zip!2-encrypted.jpg": "encrypted zip member (password required)",
        "hostile.zip!3-bad-crc.jpg": "unreadable zip member (bad CRC)",
        "hostile.zip!4-corrupt.jpg": "unreadable zip member (corrupt data)",
        "not-a.zip": "unreadable zip archive (corrupt data)"}
    assert [d.name for d in documents(items) if d.error is None] == ["1", "5", "good-after"]


@pytest.mark.parametrize("mode", ["w", "w:gz", "w:bz2", "w:xz"])
def test_truncated_tar_keeps_the_members_before_the_cut(tmp_path: Path, mode: str) -> None:
    data = tar_bytes({"1.jpg": jpeg(1), "2.pdf": pdf_bytes(2), "3.jpg": jpeg(3) + os.urandom(1_500_000)}, mode=mode)
    (tmp_path / "cut.tar").write_bytes(data[:-100_000])  # in member 3, past the first bzip2 block (900 kB)

    items = list(expand([tmp_path / "cut.tar", good(tmp_path)], LIMITS))
    assert [(d.name, d.page_count, d.error) for d in documents(items)[:2]] == [("1", 1, None), ("2", 2, None)]
    assert lines(items, tmp_path) == {"cut.tar": "unreadable tar archive after 2 members (truncated)"}
    assert_good_after(items)


def test_zip_nested_1200_deep_is_one_refusal_at_the_depth_limit(tmp_path: Path) -> None:
    data = zip_bytes({"page.jpg": jpeg(1)})
    for _ in range(1200):
        data = zip_bytes({"n.zip": data}, compression=zipfile.ZIP_STORED)
    (tmp_path / "deep.zip").write_bytes(data)

    items = list(expand([tmp_path / "deep.zip", good(tmp_path)], LIMITS))
    assert len(items) == 2
    assert lines(items, tmp_path) == {
        "deep.zip" + "!n.zip" * 4: "archive nested more than 3 deep (ingest.max_depth)"}
    assert_good_after(items)


@pytest.mark.processes
def test_pdf_with_a_200_inch_page_is_counted_not_rendered(tmp_path: Path) -> None:
    data = pdf_bytes(1, size=(14_400, 14_400))  # 200 x 200 inches: 5 GB of pixels at 200 dpi
    assert len(data) < 700
    (tmp_path / "huge-page.pdf").write_bytes(data)
    grown_mib, docs = expand_in_child(tmp_path / "huge-page.pdf", good(tmp_path))
    assert docs == [["huge-page", 1, None], ["good-after", 1, None]]
    assert grown_mib < 50  # rendered once at 72 dpi it would take 790 MiB


def encrypted_pdf() -> bytes:
    """A one-page PDF locked with a user password (its /U entry matches no password we know)."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>",
               b"<< /Filter /Standard /V 1 /R 2 /O <" + b"11" * 32 + b"> /U <" + b"22" * 32 + b"> /P -4 >>"]
    out = io.BytesIO(b"%PDF-1.4\n")
    out.seek(0, io.SEEK_END)
    offsets = []
    for i, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (i, body))
    xref = out.tell()
    out.write(b"xref\n0 5\n0000000000 65535 f \n" + b"".join(b"%010d 00000 n \n" % o for o in offsets))
    out.write(b"trailer\n<< /Size 5 /Root 1 0 R /Encrypt 4 0 R /ID [<%s> <%s>] >>\n" % (b"33" * 16, b"33" * 16))
    out.write(b"startxref\n%d\n%%%%EOF\n" % xref)
    return out.getvalue()


def test_encrypted_pdf_is_named_as_such(tmp_path: Path) -> None:
    (tmp_path / "locked.pdf").write_bytes(encrypted_pdf())
    items = list(expand([tmp_path / "locked.pdf", good(tmp_path)], LIMITS))
    assert lines(items, tmp_path) == {"locked.pdf": "encrypted PDF (password required)"}
    assert_good_after(items)


@pytest.mark.parametrize("data", [encrypted_pdf(), b"%PDF-1.4 nothing else"], ids=["encrypted", "unreadable"])
def test_a_pdf_pdfium_will_not_open_is_refused_in_the_same_words_at_upload_and_in_a_worker(
        tmp_path: Path, data: bytes) -> None:
    from paperlane.workers.preprocess import prepare_page  # OpenCV: only for the tests that prepare pages

    (tmp_path / "x.pdf").write_bytes(data)
    [uploaded] = documents(list(expand([tmp_path / "x.pdf"], LIMITS)))
    with pytest.raises(InputError) as prepared:
        prepare_page(data, InputSpec())
    assert uploaded.error is not None and str(uploaded.error) == str(prepared.value)
    assert (uploaded.error.stage, prepared.value.stage) == ("upload", "preprocess")


def test_file_larger_than_the_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    with open(tmp_path / "big.jpg", "wb") as fh:
        fh.write(jpeg(1))
        fh.truncate(1_500_000_000)  # sparse: 1.5 GB that take no disk
    paths = [tmp_path / "big.jpg", good(tmp_path)]

    started = time.monotonic()
    items, peak = traced_peak(lambda: list(expand(paths, LIMITS)))
    assert lines(items, tmp_path) == {"big.jpg": "larger than 200 MiB (ingest.max_document_bytes)"}
    assert peak < 5 * MiB and time.monotonic() - started < 5
    assert_good_after(items)


def test_fifo_socket_and_device_are_refused_without_being_opened(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    for where in (tmp_path, folder):
        os.mkfifo(where / "pipe.jpg")
        socket.socket(socket.AF_UNIX).bind(str(where / "sock.jpg"))
        (where / "null.jpg").symlink_to("/dev/null")
    (folder / "ok.jpg").write_bytes(jpeg(1))
    paths = [tmp_path / "pipe.jpg", tmp_path / "sock.jpg", tmp_path / "null.jpg", "/dev/null", folder, good(tmp_path)]

    with deadline(10):
        items = list(expand(paths, LIMITS))
    assert lines(items, tmp_path) == {
        name: "not a regular file" for name in ("pipe.jpg", "sock.jpg", "null.jpg", "/dev/null", "folder/null.jpg",
                                                 "folder/pipe.jpg", "folder/sock.jpg")}
    assert [d.name for d in documents(items) if d.error is None] == ["ok", "good-after"]


def tar_entry(tf: tarfile.TarFile, name: str, kind: bytes, *, data: bytes = b"", link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, len(data)
    tf.addfile(info, io.BytesIO(data) if data else None)


def test_tar_links_and_devices_are_ignored_and_member_names_never_touch_the_filesystem(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        tar_entry(tf, "a.jpg", tarfile.REGTYPE, data=jpeg(1))
        tar_entry(tf, "link.jpg", tarfile.SYMTYPE, link="/etc/passwd")
        tar_entry(tf, "hard.jpg", tarfile.LNKTYPE, link="a.jpg")
        tar_entry(tf, "tty.jpg", tarfile.CHRTYPE)
        tar_entry(tf, "fifo.jpg", tarfile.FIFOTYPE)
        tar_entry(tf, "../../escape.jpg", tarfile.REGTYPE, data=jpeg(2))
        tar_entry(tf, "/abs/root.jpg", tarfile.REGTYPE, data=jpeg(3))
    work = tmp_path / "work"
    work.mkdir()
    (work / "links.tar").write_bytes(buf.getvalue())
    good(work)
    before = sorted(tmp_path.rglob("*"))
    monkeypatch.chdir(work)

    items = list(expand([work / "links.tar", work / "good-after.jpg"], LIMITS))
    assert [(s.source.removeprefix(f"{work}/"), s.reason) for s in items if isinstance(s, Skipped)] == [
        ("links.tar!link.jpg", "tar symlink ignored"), ("links.tar!hard.jpg", "tar hardlink ignored"),
        ("links.tar!tty.jpg", "tar device or special file ignored"),
        ("links.tar!fifo.jpg", "tar device or special file ignored")]
    assert [(d.name, d.error) for d in documents(items)] == [
        ("a", None), ("escape", None), ("root", None), ("good-after", None)]
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("archive", ["zip", "tar"])
def test_long_and_odd_member_names_give_short_safe_names(tmp_path: Path, archive: str) -> None:
    names = ["a" * 296 + ".jpg", "é" * 150 + ".jpg", "x\x01y.jpg", "win\\dir\\w.jpg", "dir/ .jpg"]
    members = {name: jpeg(i) for i, name in enumerate(names)}
    path = tmp_path / f"names.{archive}"
    path.write_bytes(zip_bytes(members) if archive == "zip" else tar_bytes(members))

    docs = documents(list(expand([path, good(tmp_path)], LIMITS)))
    assert [d.source.removeprefix(f"{path}!") for d in docs[:-1]] == names
    assert [d.name for d in docs[:-1]] == ["a" * 100, "é" * 50, "x_y", "w", " "]
    assert all(d.error is None and len(d.name.encode()) <= 100 for d in docs)
    assert_good_after(docs)  # type: ignore[arg-type]


def test_unsupported_and_hidden_members_are_skipped_for_the_count(tmp_path: Path) -> None:
    members = {"notes.txt": b"x", ".DS_Store": b"x", "__MACOSX/._a.jpg": b"x", "sub/.hidden/b.jpg": jpeg(1),
               "a.jpg": jpeg(2), "setup.exe": b"MZ"}
    (tmp_path / "mixed.zip").write_bytes(zip_bytes(members))
    (tmp_path / "mixed.tar").write_bytes(tar_bytes(members))

    items = list(expand([tmp_path / "mixed.zip", tmp_path / "mixed.tar", good(tmp_path)], LIMITS))
    reasons = {"notes.txt": "unsupported file type", ".DS_Store": "hidden file", "__MACOSX/._a.jpg": "hidden file",
               "sub/.hidden/b.jpg": "hidden file", "setup.exe": "unsupported file type"}
    assert [(s.source.removeprefix(f"{tmp_path}/"), s.reason) for s in items if isinstance(s, Skipped)] == [
        (f"mixed.{kind}!{name}", reason) for kind in ("zip", "tar") for name, reason in reasons.items()]
    assert [d.source.removeprefix(f"{tmp_path}/") for d in documents(items)] == [
        "mixed.zip!a.jpg", "mixed.tar!a.jpg", "good-after.jpg"]


def zeros(size: int) -> io.BufferedReader:
    class Zeros(io.RawIOBase):
        left = size

        def readable(self) -> bool:
            return True

        def readinto(self, buf: memoryview) -> int:  # type: ignore[override]
            n = min(len(buf), self.left)
            buf[:n] = bytes(n)
            self.left -= n
            return n

    return io.BufferedReader(Zeros(), MiB)


def test_zip_bomb_is_refused_without_inflating_it(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "bomb.zip", "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        with zf.open("bomb.jpg", "w", force_zip64=True) as member:
            source = zeros(1 << 30)
            while chunk := source.read(MiB):
                member.write(chunk)
        zf.writestr("after.jpg", jpeg(1))
    assert (tmp_path / "bomb.zip").stat().st_size < 2 * MiB  # 1 GiB inside
    paths = [tmp_path / "bomb.zip", good(tmp_path)]

    for limits, line in [(LIMITS, "larger than 200 MiB (ingest.max_document_bytes)"),
                         (LIMITS.model_copy(update={"max_document_bytes": 4 << 30, "max_ratio": 200}),
                          "compression ratio over 200 (ingest.max_ratio)")]:
        items, peak = traced_peak(lambda limits=limits: list(expand(paths, limits)))  # type: ignore[misc]
        assert lines(items, tmp_path) == {"bomb.zip!bomb.jpg": line}
        assert [d.name for d in documents(items) if d.error is None] == ["after", "good-after"]
        assert peak < 10 * MiB


def test_a_blank_uncompressed_page_in_a_zip_is_not_taken_for_a_bomb(tmp_path: Path) -> None:
    # A white A4 page at 300 dpi, uncompressed (8.7 MB of one byte), deflates about 1,000 to 1: deflate's
    # ceiling (~1,032:1), under the default max_ratio; bombs beyond it (bzip2, xz, nesting) are still refused.
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (2480, 3508), 255).save(buf, format="BMP")
    with zipfile.ZipFile(tmp_path / "scans.zip", "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        zf.writestr("blank.bmp", buf.getvalue())
    items = list(expand([tmp_path / "scans.zip"], LIMITS))
    assert [(d.name, d.error) for d in documents(items)] == [("blank", None)]


def test_tar_gz_bomb_is_stopped_while_it_inflates(tmp_path: Path) -> None:
    with tarfile.open(tmp_path / "bomb.tar.gz", "w:gz", compresslevel=9) as tf:
        info = tarfile.TarInfo("bomb.jpg")
        info.size = 150 * MiB  # under max_document_bytes: read as a member
        tf.addfile(info, zeros(info.size))
        tar_entry(tf, "never.jpg", tarfile.REGTYPE, data=jpeg(1))
    paths = [tmp_path / "bomb.tar.gz", good(tmp_path)]

    items, peak = traced_peak(lambda: list(expand(paths, LIMITS.model_copy(update={"max_ratio": 200}))))
    assert lines(items, tmp_path) == {
        "bomb.tar.gz": "archive refused from member 1 on: compression ratio over 200 (ingest.max_ratio)"}
    assert peak < 10 * MiB
    assert_good_after(items)


def test_member_count_and_uncompressed_total_are_capped(tmp_path: Path) -> None:
    members = {f"{i}.jpg": jpeg(1) + bytes(10_000) for i in range(5)}
    (tmp_path / "many.tar").write_bytes(tar_bytes(members))
    (tmp_path / "many.zip").write_bytes(zip_bytes(members))
    paths = [tmp_path / "many.tar", tmp_path / "many.zip", good(tmp_path)]

    items = list(expand(paths, LIMITS.model_copy(update={"max_members": 3})))
    assert lines(items, tmp_path) == {
        "many.tar": "archive refused from member 4 on: more than 3 members (ingest.max_members)",
        # zipfile reads a zip's whole directory: one too long is refused before, from its end record
        "many.zip": "more than 3 members (ingest.max_members)"}
    assert [d.source.removeprefix(f"{tmp_path}/") for d in documents(items) if d.error is None] == [
        "many.tar!0.jpg", "many.tar!1.jpg", "many.tar!2.jpg", "good-after.jpg"]

    size = len(members["0.jpg"])
    items = list(expand(paths, LIMITS.model_copy(update={"max_archive_bytes": 2 * size + 5000})))
    line = f"more than {2 * size + 5000:,} bytes uncompressed (ingest.max_archive_bytes)"
    assert lines(items, tmp_path) == {"many.tar": f"archive refused from member 3 on: {line}",
                                      "many.zip": f"archive refused from member 3 on: {line}"}
    assert [d.source.removeprefix(f"{tmp_path}/") for d in documents(items) if d.error is None] == [
        "many.tar!0.jpg", "many.tar!1.jpg", "many.zip!0.jpg", "many.zip!1.jpg", "good-after.jpg"]


@pytest.mark.processes
def test_a_300_mb_tar_streams_in_bounded_memory(tmp_path: Path) -> None:
    block = os.urandom(MiB)
    member = b"\xff\xd8\xff" + block * 30  # 30 MiB that look like a JPEG
    inner = tmp_path / "inner.zip"
    with zipfile.ZipFile(inner, "w", zipfile.ZIP_STORED) as zf:  # 60 MiB: spooled to disk, not memory
        zf.writestr("z1.jpg", member)
        zf.writestr("z2.jpg", member)
    with tarfile.open(tmp_path / "big.tar", "w") as tf:
        for i in range(8):
            info = tarfile.TarInfo(f"p{i}.jpg")
            info.size = len(member)
            tf.addfile(info, io.BytesIO(member))
        tf.add(inner, "inner.zip")
    assert (tmp_path / "big.tar").stat().st_size > 300 * MiB

    grown_mib, docs = expand_in_child(tmp_path / "big.tar", good(tmp_path))
    assert [d[0] for d in docs] == [*(f"p{i}" for i in range(8)), "z1", "z2", "good-after"]
    assert all(d[2] is None for d in docs)
    assert grown_mib < 80, f"peak RSS grew {grown_mib:.0f} MiB streaming a 300 MiB tar"


def test_a_tar_of_many_members_holds_none_of_their_headers(tmp_path: Path) -> None:
    with tarfile.open(tmp_path / "many.tar", "w") as tf:
        for i in range(20_000):
            tf.addfile(tarfile.TarInfo(f"notes/{i:06}.txt"))
    paths = [tmp_path / "many.tar", good(tmp_path)]

    items, peak = traced_peak(lambda: list(expand(paths, LIMITS)))
    assert len(items) == 20_001
    assert peak < 8 * MiB  # tarfile's stream mode would keep 20,000 headers: 7 MiB more


def test_archives_cost_at_most_a_multiple_of_what_was_sent(tmp_path: Path) -> None:
    # 4 GiB of zeros in 4 MB: its member is larger than a worker takes, and skipping it inflates: stopped once the
    # call has read ingest.expansion_floor (256 MiB here: 20 x 4 MB is less) out of archives. Every archive after
    # it is refused at once; a document that is no archive's member still comes.
    bomb = zeros_tar_gz(tmp_path / "bomb.tar.gz", 4 << 30)
    (tmp_path / "later.tar").write_bytes(tar_bytes({"a.jpg": jpeg(1)}))
    paths = [bomb, tmp_path / "later.tar", good(tmp_path)]
    inflation = Inflation(LIMITS)

    started = time.process_time()
    items, peak = traced_peak(lambda: list(expand(paths, LIMITS, inflation=inflation)))
    cpu = time.process_time() - started
    why = ("archives inflate past 256 MiB, 20 times the 4 MiB sent (ingest.max_expansion, ingest.expansion_floor)")
    assert lines(items, tmp_path) == {"bomb.tar.gz!zeros.tif": "larger than 200 MiB (ingest.max_document_bytes)",
                                      "bomb.tar.gz": f"archive refused from member 1 on: {why}",
                                      "later.tar": f"archive refused: {why}"}
    assert inflation.exceeded == why and inflation.inflated <= inflation.allowed() + 2 * MiB
    assert_good_after(items)
    assert peak < 10 * MiB and cpu < 10, (peak, cpu)


def test_a_zip_whose_end_record_understates_its_directory_is_counted_from_the_directory(tmp_path: Path) -> None:
    data = bytearray(zip_bytes({f"{i}.jpg": jpeg(1) for i in range(5)}))
    end = data.rfind(b"PK\x05\x06")
    data[end + 8:end + 12] = struct.pack("<HH", 1, 1)  # "1 entry" on this disk and in all
    (tmp_path / "lying.zip").write_bytes(bytes(data))
    items = list(expand([tmp_path / "lying.zip", good(tmp_path)], LIMITS.model_copy(update={"max_members": 3})))
    assert lines(items, tmp_path) == {"lying.zip": "more than 3 members (ingest.max_members)"}
    assert_good_after(items)


def test_a_tar_member_name_that_is_not_utf8_is_read_with_replacement_characters(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT, encoding="latin-1") as tf:
        tar_entry(tf, "caf\xe9\x00.jpg".replace("\x00", ""), tarfile.REGTYPE, data=jpeg(1))  # é in Latin-1
    (tmp_path / "latin1.tar").write_bytes(buf.getvalue())
    [doc, _] = documents(list(expand([tmp_path / "latin1.tar", good(tmp_path)], LIMITS)))
    assert doc.error is None and doc.source.endswith("latin1.tar!caf\ufffd.jpg") and doc.name == "caf\ufffd"
    doc.source.encode("utf-8")  # a database takes it
