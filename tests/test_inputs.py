"""Inputs: files, folders, archives and S3 prefixes become documents with stable names, read in archive order."""

from __future__ import annotations

import io
import tarfile
import uuid
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import pypdfium2 as pdfium
import pytest
from PIL import Image

from paperlane.errors import UsageError
from paperlane.producer.input_items import Document, Skipped
from paperlane.producer.inputs import check_paths, expand
from paperlane.settings import IngestSettings
from tests.pages import render_page, sample_lines
from tests.services import S3_KEY, S3_SECRET, Service

LIMITS = IngestSettings()


def pdf_bytes(pages: int, *, size: tuple[float, float] = (595, 842)) -> bytes:
    pdf = pdfium.PdfDocument.new()
    for _ in range(pages):
        pdf.new_page(*size)
    buf = io.BytesIO()
    pdf.save(buf)
    return buf.getvalue()


def tiff_bytes(frames: int) -> bytes:
    images = [Image.new("L", (100, 80), 255) for _ in range(frames)]
    buf = io.BytesIO()
    images[0].save(buf, format="TIFF", save_all=True, append_images=images[1:])
    return buf.getvalue()


def jpeg(seed: int = 1) -> bytes:
    return render_page(sample_lines(seed, 2), fmt="JPEG", width=400)


def zip_bytes(members: dict[str, bytes], *, compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def tar_bytes(members: dict[str, bytes], *, mode: str = "w") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:  # type: ignore[call-overload]
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def documents(items: list[Document | Skipped]) -> list[Document]:
    return [d for d in items if isinstance(d, Document)]


def refusals(items: list[Document | Skipped]) -> dict[str, str]:
    """Refused documents: their source, their one line."""
    return {d.source: str(d.error) for d in documents(items) if d.error is not None}


def test_folder_of_images_pdfs_tiffs_and_archives(tmp_path: Path) -> None:
    pdf, tiff = pdf_bytes(2), tiff_bytes(3)
    (tmp_path / "a.png").write_bytes(render_page(sample_lines(1)))
    (tmp_path / "notes.txt").write_text("skipped in folders")
    (tmp_path / ".hidden.png").write_bytes(b"skipped")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "x.png").write_bytes(b"never listed")
    (tmp_path / "doc.pdf").write_bytes(pdf)
    (tmp_path / "scan.tif").write_bytes(tiff)
    (tmp_path / "batch.zip").write_bytes(zip_bytes({"inner/": b"", "inner/b.jpg": jpeg(2), "__MACOSX/._b.jpg": b"x"}))
    (tmp_path / "more.tar.gz").write_bytes(tar_bytes({"./c.png": render_page(sample_lines(3))}, mode="w:gz"))
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "sub" / "deeper" / "d.JPEG").write_bytes(jpeg(4))

    items = list(expand([tmp_path], LIMITS))
    docs = documents(items)
    assert [(d.name, d.ext, d.page_count) for d in docs] == [
        ("a", ".png", 1), ("b", ".jpg", 1), ("doc", ".pdf", 2), ("c", ".png", 1), ("scan", ".tif", 3),
        ("d", ".jpeg", 1)]
    assert all(d.error is None and d.data and d.read_s > 0 for d in docs)
    assert docs[1].source == f"{tmp_path}/batch.zip!inner/b.jpg"
    assert docs[3].source == f"{tmp_path}/more.tar.gz!./c.png"
    assert docs[2].data == pdf and docs[4].data == tiff  # stored whole: pages are rendered by the workers
    assert {(s.source.removeprefix(f"{tmp_path}/"), s.reason) for s in items if isinstance(s, Skipped)} == {
        (".git", "hidden folder"), (".hidden.png", "hidden file"), ("batch.zip!__MACOSX/._b.jpg", "hidden file"),
        ("notes.txt", "unsupported file type")}


def test_folders_are_walked_as_they_are_read(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "1.jpg").write_bytes(jpeg(1))
    (tmp_path / "b").mkdir()
    items = expand([tmp_path], LIMITS)
    assert next(items).source == f"{tmp_path}/a/1.jpg"
    (tmp_path / "b" / "2.jpg").write_bytes(jpeg(2))  # listed after the first document came out
    assert [d.source for d in items] == [f"{tmp_path}/b/2.jpg"]


@pytest.mark.parametrize("mode,suffix", [("w", ".tar"), ("w:gz", ".tgz"), ("w:bz2", ".tar.bz2"), ("w:xz", ".tar.xz")])
def test_tar_compressions_stream_in_archive_order(tmp_path: Path, mode: str, suffix: str) -> None:
    path = tmp_path / f"batch{suffix}"
    path.write_bytes(tar_bytes({"z.jpg": jpeg(1), "a.pdf": pdf_bytes(3), "m.tiff": tiff_bytes(2)}, mode=mode))
    docs = documents(list(expand([path], LIMITS)))
    assert [(d.name, d.ext, d.page_count) for d in docs] == [("z", ".jpg", 1), ("a", ".pdf", 3), ("m", ".tiff", 2)]


def test_archives_nested_in_archives(tmp_path: Path) -> None:
    inner = zip_bytes({"p.pdf": pdf_bytes(2), "deeper.tar.gz": tar_bytes({"q.png": jpeg(5)}, mode="w:gz")})
    (tmp_path / "x.tar").write_bytes(tar_bytes({"inner.zip": inner, "r.jpg": jpeg(6)}))
    docs = documents(list(expand([tmp_path / "x.tar"], LIMITS.model_copy(update={"spool_bytes": 100}))))
    assert [(d.source.removeprefix(f"{tmp_path}/"), d.page_count) for d in docs] == [
        ("x.tar!inner.zip!p.pdf", 2), ("x.tar!inner.zip!deeper.tar.gz!q.png", 1), ("x.tar!r.jpg", 1)]
    assert all(d.error is None for d in docs)


def test_content_decides_over_the_extension(tmp_path: Path) -> None:
    (tmp_path / "scan.dat").write_bytes(jpeg(1))
    (tmp_path / "really-a.jpg").write_bytes(pdf_bytes(2))
    (tmp_path / "bundle.bin").write_bytes(zip_bytes({"b.png": jpeg(2)}))
    (tmp_path / "notes.dat").write_bytes(b"just some text\n")
    paths = [tmp_path / n for n in ("scan.dat", "really-a.jpg", "bundle.bin", "notes.dat")]
    docs = documents(list(expand(paths, LIMITS)))
    assert [(d.name, d.ext, d.page_count, d.error and str(d.error)) for d in docs] == [
        ("scan", ".jpg", 1, None), ("really-a", ".pdf", 2, None), ("b", ".jpg", 1, None),
        ("notes", ".dat", 1, "unsupported file type")]


def test_unreadable_empty_and_long_documents_are_refused(tmp_path: Path) -> None:
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4 nothing else")
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "long.pdf").write_bytes(pdf_bytes(3))
    (tmp_path / "long.tif").write_bytes(tiff_bytes(3))
    (tmp_path / "ok.tif").write_bytes(tiff_bytes(2))
    items = list(expand([tmp_path], LIMITS.model_copy(update={"max_pages": 2})))
    assert {Path(k).name: v for k, v in refusals(items).items()} == {
        "broken.pdf": "unreadable PDF (PDFium: Data format error)", "empty.jpg": "empty file",
        "long.pdf": "more than 2 pages (ingest.max_pages)", "long.tif": "more than 2 pages (ingest.max_pages)"}
    assert all(d.data == b"" and d.page_count == 1 and d.error and d.error.stage == "upload"
               for d in documents(items) if d.error)
    assert [d.page_count for d in documents(items) if d.error is None] == [2]


def test_document_larger_than_the_limit_is_refused(tmp_path: Path) -> None:
    (tmp_path / "big.jpg").write_bytes(jpeg(1) + bytes(5000))
    (tmp_path / "big.zip").write_bytes(zip_bytes({"big.jpg": jpeg(1) + bytes(5000), "small.jpg": b"\xff\xd8\xff"}))
    items = list(expand([tmp_path], LIMITS.model_copy(update={"max_document_bytes": 4000})))
    assert {Path(k).name: v for k, v in refusals(items).items()} == {
        "big.jpg": "larger than 4,000 bytes (ingest.max_document_bytes)",
        "big.zip!big.jpg": "larger than 4,000 bytes (ingest.max_document_bytes)"}
    assert [d.name for d in documents(items) if d.error is None] == ["small"]


def test_missing_paths_are_usage_errors(tmp_path: Path) -> None:
    (tmp_path / "a.jpg").write_bytes(jpeg(1))
    check_paths([tmp_path / "a.jpg", tmp_path, "s3://bucket/prefix"])
    with pytest.raises(UsageError, match="no such file or folder"):
        check_paths([tmp_path / "a.jpg", tmp_path / "nope"])
    with pytest.raises(UsageError, match="no bucket"):
        check_paths(["s3:///key"])
    with pytest.raises(UsageError, match="no such file or folder"):
        list(expand([tmp_path / "nope"], LIMITS))
    with pytest.raises(UsageError, match="needs S3 settings"):
        list(expand(["s3://bucket/x"], LIMITS))


@pytest.fixture
def s3_bucket(s3_service: Service) -> tuple[object, str]:
    client = boto3.client("s3", endpoint_url=s3_service.url, aws_access_key_id=S3_KEY,
                          aws_secret_access_key=S3_SECRET, region_name="us-east-1")
    bucket = f"inputs-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    return client, bucket


def test_s3_prefix_is_listed_page_by_page_and_streamed(s3_bucket: tuple[object, str]) -> None:
    client, bucket = s3_bucket
    put = client.put_object  # type: ignore[attr-defined]
    objects = {"scans/a.jpg": jpeg(1), "scans/sub/doc.pdf": pdf_bytes(2), "scans/.hidden.jpg": jpeg(2),
               "scans/batch.tar.gz": tar_bytes({"t.png": jpeg(3), "u.pdf": pdf_bytes(1)}, mode="w:gz"),
               "scans/x.zip": zip_bytes({"z.jpg": jpeg(4)}), "scans2/other.jpg": jpeg(5)}
    objects |= {f"scans/notes/{i:04}.txt": b"n" for i in range(1005)}  # more than one listing page (1,000 keys)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda kv: put(Bucket=bucket, Key=kv[0], Body=kv[1]), objects.items()))

    items = list(expand([f"s3://{bucket}/scans"], LIMITS.model_copy(update={"spool_bytes": 100}), s3=client))
    assert [(d.source, d.page_count, d.error) for d in documents(items)] == [
        (f"s3://{bucket}/scans/a.jpg", 1, None), (f"s3://{bucket}/scans/batch.tar.gz!t.png", 1, None),
        (f"s3://{bucket}/scans/batch.tar.gz!u.pdf", 1, None), (f"s3://{bucket}/scans/sub/doc.pdf", 2, None),
        (f"s3://{bucket}/scans/x.zip!z.jpg", 1, None)]
    assert documents(items)[0].data == objects["scans/a.jpg"]
    skipped = [s.reason for s in items if isinstance(s, Skipped)]
    assert skipped.count("unsupported file type") == 1005 and skipped.count("hidden file") == 1

    [one] = list(expand([f"s3://{bucket}/scans/sub/doc.pdf"], LIMITS, s3=client))
    assert isinstance(one, Document) and one.name == "doc" and one.page_count == 2
    with pytest.raises(UsageError, match="nothing under"):
        list(expand([f"s3://{bucket}/nothing-here"], LIMITS, s3=client))
    with pytest.raises(UsageError, match="NoSuchBucket"):
        list(expand([f"s3://{bucket}-missing/scans"], LIMITS, s3=client))
