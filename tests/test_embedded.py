"""``paperlane run``: the whole pipeline in one process on SQLite and a local folder."""

from __future__ import annotations

import io
import json
from pathlib import Path

import cv2
import pytest

from tests.conftest import Stack, cli
from tests.pages import BAD_INPUTS, render_page, sample_lines, truncated_jpeg
from tests.scoring import cer

pytestmark = pytest.mark.slow


def test_run_writes_the_output_contract(embedded: Stack, tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    truths = {}
    for i in range(3):
        lines = sample_lines(10 + i)
        (src / f"page{i}.png").write_bytes(render_page(lines))
        truths[f"page{i}"] = "\n".join(lines)
    rotated = sample_lines(20)
    (src / "rotated.jpg").write_bytes(render_page(rotated, exif_rotate=True))
    truths["rotated"] = "\n".join(rotated)
    out = tmp_path / "out"

    res = cli(embedded, "run", str(src), "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "where the time went" in res.stdout and "inference" in res.stdout
    for name, truth in truths.items():
        result = json.loads((out / f"{name}.json").read_text())
        assert result["status"] == "succeeded" and result["error"] is None
        assert cer(result["text"], truth) < 0.02, (name, result["text"])
        assert {"preprocess", "inference", "postprocess", "store"} <= set(result["timings"])
        assert cv2.imread(str(out / f"{name}.annotated.jpg")) is not None  # the annotated image: JPEG unless asked
        for line in result["lines"]:
            xs, ys = [p[0] for p in line["quad"]], [p[1] for p in line["quad"]]
            assert 0 <= min(xs) and max(xs) <= result["width"] + 2 and max(ys) <= result["height"] + 2
    rotated_result = json.loads((out / "rotated.json").read_text())
    assert rotated_result["width"] == 1240  # EXIF orientation applied: the page is upright


def test_run_reports_bad_pages_and_exits_1(embedded: Stack, tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    for name, data in BAD_INPUTS.items():
        (src / name).write_bytes(data)
    (src / "truncated.jpg").write_bytes(truncated_jpeg(sample_lines(1)))
    (src / "good.png").write_bytes(render_page(sample_lines(2)))
    out = tmp_path / "out"

    res = cli(embedded, "run", *(str(p) for p in sorted(src.iterdir())), "--out", str(out))
    assert res.returncode == 1, res.stdout + res.stderr
    statuses = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert statuses["good"]["status"] == "succeeded"
    for name in ("empty", "text-named", "huge-declared", "truncated"):
        assert statuses[name]["status"] == "failed"
        assert statuses[name]["error"] and "\n" not in statuses[name]["error"]
        assert not list(out.glob(f"{name}.annotated.*"))  # no annotated image for a failed page


def test_run_twice_resumes_instead_of_redoing(embedded: Stack, tmp_path: Path) -> None:
    page = tmp_path / "page.png"
    page.write_bytes(render_page(sample_lines(4)))
    first = cli(embedded, "run", str(page), "--out", str(tmp_path / "a"))
    second = cli(embedded, "run", str(page), "--out", str(tmp_path / "b"))
    assert first.returncode == second.returncode == 0
    a = json.loads((tmp_path / "a/page.json").read_text())
    b = json.loads((tmp_path / "b/page.json").read_text())
    assert a == b
    assert len(list((embedded.settings.data_dir / "objects/results").iterdir())) == 1


def test_usage_errors_exit_2(embedded: Stack, tmp_path: Path) -> None:
    assert cli(embedded, "run", str(tmp_path / "missing.png"), "--out", str(tmp_path)).returncode == 2
    assert cli(embedded, "run", "--no-such-option").returncode == 2
    assert cli(embedded, "run", str(tmp_path), "--out", str(tmp_path), "--task", "fields").returncode == 2
    unknown = cli(embedded, "run", str(tmp_path), "--out", str(tmp_path), "--formats", "json,docx")
    assert unknown.returncode == 2 and "--formats" in unknown.stderr and "alto" in unknown.stderr


def test_run_writes_document_outputs_and_shares_a_repeated_page(embedded: Stack, tmp_path: Path) -> None:
    import io

    import pypdfium2 as pdfium
    from PIL import Image
    from sqlalchemy import func, select

    from paperlane.storage.db import Database
    from paperlane.storage.tables import JobRow, PageRow

    scans = tmp_path / "scans"
    (scans / "sub").mkdir(parents=True)
    pages = [Image.open(io.BytesIO(render_page(sample_lines(i, 3)))).convert("RGB") for i in (21, 22)]
    pages[0].save(scans / "book.pdf", save_all=True, append_images=pages[1:], resolution=150)
    cover = render_page(sample_lines(23, 2))
    (scans / "cover.png").write_bytes(cover)
    (scans / "sub" / "cover.png").write_bytes(cover)  # the same page in a second document, same stem
    out = tmp_path / "out"
    proc = cli(embedded, "run", str(scans), "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = sorted(p.name for p in out.iterdir())
    assert {"book.json", "book.md", "book.pdf", "book-p1.json", "book-p2.json", "cover.json", "cover.pdf",
            "cover-2.json", "cover-2.md"} <= set(names), names
    book = json.loads((out / "book.json").read_text())
    assert [p["page"] for p in book["pages"]] == [1, 2] and book["counts"]["succeeded"] == 2
    page_text = [json.loads((out / f"book-p{i}.json").read_text())["text"] for i in (1, 2)]
    pdf = pdfium.PdfDocument(out / "book.pdf")
    assert len(pdf) == 2
    for i, text in enumerate(page_text):
        layer = pdf[i].get_textpage().get_text_range()
        assert text.split()[0] in layer and text.split()[-1] in layer
    assert page_text[0].split("\n")[0] in (out / "book.md").read_text()
    db = Database(embedded.settings.database_url)
    with db.session() as s:  # four pages, three jobs: the repeated cover was one inference
        assert (s.scalar(select(func.count()).select_from(PageRow)),
                s.scalar(select(func.count()).select_from(JobRow))) == (4, 3)


def test_a_pdf_whose_header_starts_late_is_a_pdf_to_producer_and_worker(embedded: Stack, tmp_path: Path) -> None:
    from PIL import Image

    lines = sample_lines(31)
    buf = io.BytesIO()
    Image.open(io.BytesIO(render_page(lines))).save(buf, format="PDF", resolution=150)
    scan = tmp_path / "late.pdf"
    scan.write_bytes(b"mail gateway banner before the header\n" * 20 + buf.getvalue())  # 780 bytes, then %PDF-
    out = tmp_path / "out"
    res = cli(embedded, "run", str(scan), "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads((out / "late.json").read_text())
    assert result["status"] == "succeeded" and cer(result["text"], "\n".join(lines)) < 0.05, result["error"]
