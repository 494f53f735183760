"""Inputs: folders, PDFs, multi-page TIFFs and archives become pages with stable names."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pypdfium2 as pdfium
import pytest
from PIL import Image

from paperlane.errors import UsageError
from paperlane.producer.inputs import expand
from tests.pages import render_page, sample_lines


def _pdf(pages: int) -> bytes:
    pdf = pdfium.PdfDocument.new()
    for _ in range(pages):
        pdf.new_page(595, 842)
    buf = io.BytesIO()
    pdf.save(buf)
    return buf.getvalue()


def test_folder_pdf_tiff_zip_tar(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(render_page(sample_lines(1)))
    (tmp_path / "notes.txt").write_text("skipped in folders")
    (tmp_path / ".hidden.png").write_bytes(b"skipped")
    (tmp_path / "doc.pdf").write_bytes(_pdf(2))
    frames = [Image.new("L", (100, 80), 255) for _ in range(3)]
    frames[0].save(tmp_path / "scan.tif", save_all=True, append_images=frames[1:])
    with zipfile.ZipFile(tmp_path / "batch.zip", "w") as zf:
        zf.writestr("inner/b.jpg", render_page(sample_lines(2), fmt="JPEG"))
        zf.writestr("__MACOSX/._b.jpg", b"junk")
    with tarfile.open(tmp_path / "more.tar.gz", "w:gz") as tf:
        data = render_page(sample_lines(3))
        info = tarfile.TarInfo("c.png")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))

    pages = list(expand([tmp_path]))
    assert [(p.name, p.page) for p in pages] == [
        ("a", 1), ("b", 1), ("doc-p1", 1), ("doc-p2", 2), ("c", 1), ("scan-p1", 1), ("scan-p2", 2), ("scan-p3", 3)]
    assert all(p.error is None and p.data for p in pages)
    assert pages[1].source.endswith("batch.zip!inner/b.jpg")


def test_broken_pdf_yields_one_failed_page(tmp_path: Path) -> None:
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4 nothing else")
    [page] = list(expand([tmp_path / "broken.pdf"]))
    assert page.error is not None and "unreadable PDF" in str(page.error)


def test_explicit_file_of_any_name_is_taken_as_an_image(tmp_path: Path) -> None:
    (tmp_path / "scan.dat").write_bytes(b"whatever")
    [page] = list(expand([tmp_path / "scan.dat"]))
    assert page.name == "scan" and page.error is None


def test_missing_path_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        list(expand([tmp_path / "nope"]))
