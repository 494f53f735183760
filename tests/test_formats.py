"""Archive formats: ALTO validated against the ALTO 4.4 schema, PAGE XML and METS against the schemas the
``ocrd-validators`` package ships, hOCR read by a real consumer (OCRmyPDF's hocrtransform, whose PDF's
text layer must hold the page's words); and every format's text read back equals the result's text,
for real results of ``paperlane run`` (a receipt, a two-column page, an EXIF-rotated scan, a PDF page),
the real scans of the corpus, and made-up results in Chinese, Hebrew and without geometry."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pypdfium2 as pdfium
import pytest
from lxml import etree
from PIL import Image

from paperlane.formats import FORMATS, document_bytes, file_name, page_bytes
from paperlane.formats.view import page_view
from paperlane.schemas import Block, BlockKind, EngineInfo, JobStatus, Line, OutputFormat, PageResult, Task, Word
from paperlane.formats import document_bytes as document_output
from paperlane.formats import page_bytes as page_output
from tests.corpus import REPO, corpus_root, funsd_pages, run_paperlane, sroie_pages
from tests.pages import render_columns, render_page, sample_lines

xmlschema = pytest.importorskip("xmlschema", reason="the test extra installs xmlschema")

ALTO_NS = "{http://www.loc.gov/standards/alto/ns-v4#}"
PAGE_NS = "{http://schema.primaresearch.org/PAGE/gts/pagecontent/2019-07-15}"
METS_NS = "{http://www.loc.gov/METS/}"
XHTML_NS = "{http://www.w3.org/1999/xhtml}"
CREATED = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
ENGINE = EngineInfo(name="rapidocr", version="3.4.0", model="PP-OCR (bundled)")


# -- schemas ---------------------------------------------------------------------------------------------

def _schemas_dir() -> Path:
    return Path(os.environ.get("PAPERLANE_SCHEMAS") or REPO.parent / "shared" / "schemas")


def _ocrd_dir() -> Path:
    spec = importlib.util.find_spec("ocrd_validators")  # found, not imported: its own imports need pydantic 1
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("ocrd-validators is not installed (scripts/test installs it with --no-deps)")
    return Path(list(spec.submodule_search_locations)[0])


@pytest.fixture(scope="module")
def alto_schema() -> Any:
    path = _schemas_dir() / "alto-4-4.xsd"
    if not path.exists():
        pytest.skip(f"the ALTO 4.4 schema is not at {path} (shared/schemas, or env PAPERLANE_SCHEMAS)")
    return xmlschema.XMLSchema(str(path), locations=[("http://www.w3.org/1999/xlink", str(_ocrd_dir() / "xlink.xsd"))])


@pytest.fixture(scope="module")
def page_schema() -> Any:
    return xmlschema.XMLSchema(str(_ocrd_dir() / "page.xsd"))


@pytest.fixture(scope="module")
def mets_schema() -> Any:
    return xmlschema.XMLSchema(str(_ocrd_dir() / "mets.xsd"))


def _valid(schema: Any, data: bytes) -> None:
    errors = [str(e).splitlines()[0] for e in schema.iter_errors(io.BytesIO(data))]
    assert not errors, "\n".join(errors[:5])


# -- reading each format back ----------------------------------------------------------------------------

def _folded(text: str) -> str:
    return " ".join(text.split())


def _alto_text(data: bytes) -> list[str]:
    """Each page's text as an ALTO reader gets it: Strings joined by SP, a line a TextLine, in order."""
    root = etree.fromstring(data)
    pages = []
    for page in root.iter(f"{ALTO_NS}Page"):
        lines = []
        for line in page.iter(f"{ALTO_NS}TextLine"):
            lines.append(" ".join(s.get("CONTENT") for s in line.iter(f"{ALTO_NS}String")))
        pages.append("\n".join(lines))
    return pages


def _page_text(data: bytes) -> str:
    """A PAGE XML page's text: each line's words in reading order of the regions, checked against the
    line's own TextEquiv."""
    root = etree.fromstring(data)
    regions = {r.get("id"): r for r in root.iter(f"{PAGE_NS}TextRegion", f"{PAGE_NS}TableRegion")}
    order = [regions[ref.get("regionRef")] for ref in root.iter(f"{PAGE_NS}RegionRefIndexed")]
    assert len(order) == len([r for r in regions.values() if r.getparent().tag == f"{PAGE_NS}Page"])
    lines = []
    for region in order:
        for line in region.iter(f"{PAGE_NS}TextLine"):
            words = [w.findtext(f"{PAGE_NS}TextEquiv/{PAGE_NS}Unicode") for w in line.iter(f"{PAGE_NS}Word")]
            assert " ".join(words) == line.find(f"{PAGE_NS}TextEquiv/{PAGE_NS}Unicode").text
            lines.append(" ".join(words))
    return "\n".join(lines)


def _hocr_text(data: bytes) -> list[str]:
    root = etree.fromstring(data)
    pages = []
    for page in root.iter(f"{XHTML_NS}div"):
        if page.get("class") != "ocr_page":
            continue
        lines = [" ".join(w.text for w in line.iter(f"{XHTML_NS}span") if w.get("class") == "ocrx_word")
                 for line in page.iter(f"{XHTML_NS}span")
                 if line.get("class") in ("ocr_line", "ocr_header", "ocr_footer")]
        pages.append("\n".join(lines))
    return pages


def _check_page(result: PageResult, alto_schema: Any, page_schema: Any) -> dict[OutputFormat, bytes]:
    """Every archive format of ``result``: valid, and its text read back is the result's text."""
    made = {fmt: page_bytes(fmt, result, name="scan", ext=".jpg", created=CREATED)
            for fmt in (OutputFormat.ALTO, OutputFormat.PAGE, OutputFormat.HOCR)}
    _valid(alto_schema, made[OutputFormat.ALTO])
    _valid(page_schema, made[OutputFormat.PAGE])
    expected = _folded(result.text) if result.task not in (Task.FIELDS, Task.TRANSLATE) else ""
    assert _folded(_alto_text(made[OutputFormat.ALTO])[0]) == expected
    assert _folded(_page_text(made[OutputFormat.PAGE])) == expected
    assert _folded(_hocr_text(made[OutputFormat.HOCR])[0]) == expected
    return made


# -- made-up results ------------------------------------------------------------------------------------

def _quad(x: float, y: float, w: float, h: float) -> list[tuple[float, float]]:
    return [(x, y), (x + w, y), (x + w, y + h), (x, y + h)]


def _result(lines: list[Line], *, page: int = 1, size: tuple[int, int] = (1240, 1754), **fields: Any) -> PageResult:
    return PageResult(job_id=f"job-{page}", source="s3://archive/doc.pdf", page=page, status=JobStatus.SUCCEEDED,
                      text=fields.pop("text", "\n".join(ln.text for ln in lines)), lines=lines, width=size[0],
                      height=size[1], engine=ENGINE, **fields)


CHINESE = _result([Line(text="北京市朝阳区 建国路88号", confidence=0.97, quad=_quad(100, 100, 700, 60)),
                   Line(text="发票号码 2024-117", confidence=0.91, quad=_quad(100, 200, 500, 60))])
HEBREW = _result([Line(text="שלום עולם", confidence=0.88, quad=_quad(700, 100, 400, 60)),
                  Line(text="חשבונית מס 117", confidence=0.9, quad=_quad(600, 200, 500, 60))])
WITH_WORDS = _result([Line(text="Total due 12.00", confidence=0.95, quad=_quad(100, 100, 600, 50), block=0,
                           words=[Word(text="Total", quad=_quad(100, 100, 180, 50)),
                                  Word(text="due", quad=_quad(300, 100, 100, 50), confidence=0.5),
                                  Word(text="12.00", quad=_quad(520, 100, 180, 50))])],
                     blocks=[Block(kind=BlockKind.PARAGRAPH, quad=_quad(100, 100, 600, 50))])
PARSED = _result([], task=Task.PARSE, markdown=(
    "# Annual report\n\nRevenue grew 12 % &amp; costs fell.\nSecond line.\n\n"
    "<table><tr><td>Year</td><td>Revenue</td></tr><tr><td>2024</td><td>1,200</td></tr></table>\n\nThe end."),
    text="Annual report\n\nRevenue grew 12 % & costs fell.\nSecond line.\n\nYear\tRevenue\n2024\t1,200\n\nThe end.")
FAILED = PageResult(job_id="job-2", source="s3://archive/doc.pdf", page=2, status=JobStatus.FAILED,
                    error="engine timed out; after 120 s \x00")
FIELDS = _result([], task=Task.FIELDS, fields={"total": "12.00"}, text='{"total": "12.00"}')
NONSENSE = _result([Line(text="good\tline\x00", quad=_quad(10, 10, 200, 30)),
                    Line(text="lone \ud800 surrogate", quad=_quad(10, 60, 200, 30))], text="good line\nlone surrogate")


@pytest.mark.parametrize("result", [CHINESE, HEBREW, WITH_WORDS, PARSED, FAILED, FIELDS, NONSENSE],
                         ids=["chinese", "hebrew", "engine-words", "parse-markdown", "failed", "fields", "nonsense"])
def test_made_up_pages_are_valid_and_read_back_their_text(result: PageResult, alto_schema: Any,
                                                          page_schema: Any) -> None:
    _check_page(result, alto_schema, page_schema)


def test_each_format_carries_words_confidence_estimates_and_metadata(alto_schema: Any, page_schema: Any) -> None:
    made = _check_page(WITH_WORDS, alto_schema, page_schema)
    alto = etree.fromstring(made[OutputFormat.ALTO])
    strings = list(alto.iter(f"{ALTO_NS}String"))
    assert [(s.get("CONTENT"), s.get("HPOS"), s.get("WIDTH"), s.get("WC")) for s in strings] == [
        ("Total", "100", "180", "0.95"), ("due", "300", "100", "0.5"), ("12.00", "520", "180", "0.95")]
    assert [(sp.get("HPOS"), sp.get("WIDTH")) for sp in alto.iter(f"{ALTO_NS}SP")] == [("280", "20"), ("400", "120")]
    assert alto.find(f".//{ALTO_NS}TextLine/{ALTO_NS}Shape/{ALTO_NS}Polygon").get("POINTS") == \
        "100,100 700,100 700,150 100,150"
    assert "rapidocr 3.4.0" in alto.findtext(f".//{ALTO_NS}applicationDescription")
    assert alto.findtext(f".//{ALTO_NS}softwareName") == "paperlane"
    assert alto.find(f".//{ALTO_NS}Page").get("PC") == "0.95"
    page = etree.fromstring(made[OutputFormat.PAGE])
    assert [e.get("conf") for e in page.iter(f"{PAGE_NS}TextEquiv")][:3] == ["0.95", "0.5", "0.95"]
    hocr = made[OutputFormat.HOCR].decode()
    assert 'title="bbox 300 100 400 150; x_wconf 50"' in hocr and "ocr-system" in hocr
    assert "x_estimated" not in hocr and "ESTIMATED" not in made[OutputFormat.ALTO].decode()

    # Lines without word boxes: words laid out along the line, marked in each format's way.
    estimated = {fmt: page_bytes(fmt, CHINESE, name="scan", created=CREATED) for fmt in made}
    assert b'TAGREFS="ESTIMATED"' in estimated[OutputFormat.ALTO] and b"<OtherTag ID=\"ESTIMATED\"" in \
        estimated[OutputFormat.ALTO]
    assert b'custom="geometry {estimated:true;}"' in estimated[OutputFormat.PAGE]
    assert b"x_estimated 1" in estimated[OutputFormat.HOCR]
    hebrew = page_bytes(OutputFormat.PAGE, HEBREW, name="scan", created=CREATED)
    assert b'readingDirection="right-to-left"' in hebrew


def test_a_failed_page_is_an_empty_page_that_says_why(alto_schema: Any, page_schema: Any) -> None:
    made = _check_page(FAILED, alto_schema, page_schema)
    reason = "page 2 failed: engine timed out; after 120 s"
    assert etree.fromstring(made[OutputFormat.ALTO]).find(f".//{ALTO_NS}Page").get("QUALITY_DETAIL") == reason
    assert etree.fromstring(made[OutputFormat.PAGE]).findtext(f".//{PAGE_NS}Comments") == reason
    hocr = etree.fromstring(made[OutputFormat.HOCR])
    [page] = [d for d in hocr.iter(f"{XHTML_NS}div") if d.get("class") == "ocr_page"]
    assert page.get("title").endswith('; x_note "page 2 failed: engine timed out, after 120 s"')


def test_a_quality_grade_lights_up_when_the_result_has_one() -> None:
    class Grade:  # the shape issue 16's PageResult.quality will have
        confidence, needs_review, flags = 0.42, True, ["low_confidence"]

    graded = CHINESE.model_copy()
    object.__setattr__(graded, "quality", Grade())
    view = page_view(graded)
    assert (view.confidence, view.needs_review, view.flags) == (0.42, True, ("low_confidence",))
    alto = page_bytes(OutputFormat.ALTO, graded, name="scan").decode()
    assert 'PC="0.42"' in alto and 'QUALITY_DETAIL="needs review: low_confidence"' in alto


def test_a_document_keeps_every_page_in_order_and_its_mets_ties_them_together(
        alto_schema: Any, mets_schema: Any) -> None:
    pages = [CHINESE.model_copy(update={"page": 3}), FAILED, WITH_WORDS]  # any order: page order comes back
    alto = document_bytes(OutputFormat.ALTO, pages, document_id="doc-1", name="doc", ext=".pdf")
    _valid(alto_schema, alto)
    assert [p.get("ID") for p in etree.fromstring(alto).iter(f"{ALTO_NS}Page")] == ["P1", "P2", "P3"]
    assert [_folded(t) for t in _alto_text(alto)] == ["Total due 12.00", "", _folded(CHINESE.text)]
    hocr = document_bytes(OutputFormat.HOCR, pages, document_id="doc-1", name="doc", ext=".pdf")
    assert [_folded(t) for t in _hocr_text(hocr)] == ["Total due 12.00", "", _folded(CHINESE.text)]
    assert b'image &quot;doc.pdf#page=2&quot;' in hocr

    mets = document_bytes(OutputFormat.METS, pages, document_id="doc-1", name="doc", ext=".pdf")
    _valid(mets_schema, mets)
    root = etree.fromstring(mets)
    hrefs = {f.get("ID"): f.find(f"{METS_NS}FLocat").get("{http://www.w3.org/1999/xlink}href")
             for f in root.iter(f"{METS_NS}file")}
    divs = list(root.iter(f"{METS_NS}div"))[1:]
    assert [d.get("ORDER") for d in divs] == ["1", "2", "3"]
    assert [[hrefs[p.get("FILEID")] for p in d] for d in divs] == [
        [f"doc.pdf#page={n}", f"doc-p{n}.alto.xml", f"doc-p{n}.page.xml"] for n in (1, 2, 3)]
    assert divs[1].get("LABEL").startswith("page 2 failed") and divs[0].get("LABEL") is None
    assert [g.get("USE") for g in root.iter(f"{METS_NS}fileGrp")] == ["IMAGE", "FULLTEXT", "PAGEXML"]


def test_the_registry_names_every_format_and_refuses_forms_a_format_lacks() -> None:
    assert set(FORMATS) == set(OutputFormat)
    assert file_name("scan", OutputFormat.ALTO) == "scan.alto.xml"
    assert file_name("scan", OutputFormat.PAGE, 3, page_count=4) == "scan-p3.page.xml"
    from paperlane.errors import UsageError

    with pytest.raises(UsageError):
        document_bytes(OutputFormat.PAGE, [CHINESE], document_id="d", name="n")
    with pytest.raises(UsageError):
        page_bytes(OutputFormat.METS, CHINESE, name="n")
    for fmt, spec in FORMATS.items():  # every form the registry promises is built
        if spec.page:
            assert page_output(fmt, CHINESE, name="scan", ext=".png")
        if spec.document:
            assert document_output(fmt, [CHINESE, FAILED], document_id="d", source="s", name="scan", ext=".png")


def test_the_same_result_gives_the_same_bytes() -> None:
    for fmt in (OutputFormat.ALTO, OutputFormat.PAGE, OutputFormat.HOCR):
        assert page_bytes(fmt, PARSED, name="a", created=CREATED) == page_bytes(fmt, PARSED, name="a", created=CREATED)


# -- real results: paperlane run ---------------------------------------------------------------------------

def _hocr_consumer_words(hocr: bytes, tmp: Path) -> list[str]:
    """The words of the text layer of the PDF that OCRmyPDF's hOCR transform makes of ``hocr``."""
    src, out = tmp / "page.hocr", tmp / "page.pdf"
    src.write_bytes(hocr)
    proc = subprocess.run([sys.executable, "-m", "ocrmypdf.hocrtransform", str(src), str(out)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    pdf = pdfium.PdfDocument(out.read_bytes())
    try:
        return pdf[0].get_textpage().get_text_range().split()
    finally:
        pdf.close()


ALL_FORMATS = "json,md,pdf,alto,page,hocr,mets"


@dataclass(frozen=True)
class RunOutput:
    out: Path  # the run's OUT folder
    results: dict[str, PageResult]  # each single-page document's page result, by its key


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> RunOutput:
    """``paperlane run --formats`` (every format) on a receipt, a two-column page, an EXIF-rotated scan, a scanned
    PDF page, and a three-page TIFF whose second page fails (over the worker's pixel limit)."""
    root = tmp_path_factory.mktemp("formats")
    src = root / "in"
    src.mkdir()
    receipt = ["STORE 42 MAIN STREET", "Coffee 3.50", "Bagel 2.25", "TOTAL 5.75", "THANK YOU"]
    (src / "receipt.png").write_bytes(render_page(receipt, width=700))
    columns, _ = render_columns(2, seed=5, rows=8)
    (src / "columns.png").write_bytes(columns)
    (src / "rotated.jpg").write_bytes(render_page(sample_lines(4), exif_rotate=True))
    scan = Image.open(io.BytesIO(render_page(sample_lines(9)))).convert("RGB")
    buf = io.BytesIO()
    scan.save(buf, format="PDF", resolution=150)
    (src / "scanned.pdf").write_bytes(buf.getvalue())
    frames = [Image.open(io.BytesIO(render_page(sample_lines(n, 2)))).convert("L") for n in (11, 12)]
    buf = io.BytesIO()
    too_large = Image.new("1", (12_300, 12_300), 1)  # 151 MP, over worker.max_image_pixels: refused unread
    frames[0].save(buf, format="TIFF", save_all=True, compression="tiff_deflate", append_images=[too_large, frames[1]])
    (src / "gapped.tif").write_bytes(buf.getvalue())
    results = run_paperlane(sorted(src.iterdir()), root, timeout=600, args=["--formats", ALL_FORMATS])
    names = {"receipt": "receipt", "columns": "columns", "rotated": "rotated", "pdf": "scanned"}
    return RunOutput(root / "out", {key: PageResult.model_validate(results[stem]) for key, stem in names.items()})


def _check_files(out: Path, stem: str, result: PageResult, schemas: dict[str, Any]) -> None:
    """The run's files of a one-page document: every archive format valid, read back equal to the result's
    text, and its METS pointing at its ALTO and PAGE XML beside it."""
    alto, page, hocr, mets = (out / file_name(stem, fmt) for fmt in (OutputFormat.ALTO, OutputFormat.PAGE,
                                                                      OutputFormat.HOCR, OutputFormat.METS))
    _valid(schemas["alto"], alto.read_bytes())
    _valid(schemas["page"], page.read_bytes())
    _valid(schemas["mets"], mets.read_bytes())
    expected = _folded(result.text)
    assert _folded(_alto_text(alto.read_bytes())[0]) == expected
    assert _folded(_page_text(page.read_bytes())) == expected
    assert _folded(_hocr_text(hocr.read_bytes())[0]) == expected
    hrefs = [f.get("{http://www.w3.org/1999/xlink}href") for f in etree.fromstring(mets.read_bytes()).iter(
        f"{METS_NS}FLocat")]
    assert hrefs[1:] == [alto.name, page.name] and all((out / href).exists() for href in hrefs[1:])


@pytest.fixture(scope="module")
def schemas(alto_schema: Any, page_schema: Any, mets_schema: Any) -> dict[str, Any]:
    return {"alto": alto_schema, "page": page_schema, "mets": mets_schema}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["receipt", "columns", "rotated", "pdf"])
def test_run_writes_every_format_valid_read_back_and_its_hocr_makes_a_searchable_pdf(
        name: str, real_run: RunOutput, schemas: dict[str, Any], tmp_path: Path) -> None:
    result = real_run.results[name]
    assert result.status is JobStatus.SUCCEEDED and result.lines and result.blocks
    assert all(ln.words and not any(w.estimated for w in ln.words) for ln in result.lines)  # RapidOCR's boxes
    stem = Path(result.source).stem
    _check_files(real_run.out, stem, result, schemas)
    assert _hocr_consumer_words((real_run.out / f"{stem}.hocr").read_bytes(), tmp_path) == result.text.split()
    assert {p.name for p in real_run.out.glob(f"{stem}.*")} == {
        f"{stem}{suffix}" for suffix in (".json", ".annotated.jpg", ".md", ".pdf", ".alto.xml", ".page.xml",
                                         ".hocr", ".mets.xml")}


@pytest.mark.slow
def test_run_keeps_a_failed_pages_place_in_every_format(real_run: RunOutput, schemas: dict[str, Any]) -> None:
    out = real_run.out
    pages = [PageResult.model_validate_json((out / f"gapped-p{n}.json").read_text()) for n in (1, 2, 3)]
    assert [p.status for p in pages] == [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.SUCCEEDED]
    texts = [_folded(p.text) for p in pages]
    assert texts[1] == "" and texts[0] and texts[2]
    alto = (out / "gapped.alto.xml").read_bytes()
    _valid(schemas["alto"], alto)
    assert [_folded(t) for t in _alto_text(alto)] == texts
    assert etree.fromstring(alto).findall(f".//{ALTO_NS}Page")[1].get("QUALITY_DETAIL").startswith("page 2 failed")
    assert [_folded(t) for t in _hocr_text((out / "gapped.hocr").read_bytes())] == texts
    for n in (1, 2, 3):  # each page's own files, which the METS lists
        _valid(schemas["page"], (out / f"gapped-p{n}.page.xml").read_bytes())
        assert _folded(_page_text((out / f"gapped-p{n}.page.xml").read_bytes())) == texts[n - 1]
        assert [_folded(t) for t in _alto_text((out / f"gapped-p{n}.alto.xml").read_bytes())] == [texts[n - 1]]
    assert "page 2 failed" in etree.fromstring((out / "gapped-p2.page.xml").read_bytes()).findtext(
        f".//{PAGE_NS}Comments")
    mets = etree.fromstring((out / "gapped.mets.xml").read_bytes())
    _valid(schemas["mets"], (out / "gapped.mets.xml").read_bytes())
    divs = list(mets.iter(f"{METS_NS}div"))[1:]
    assert [d.get("ORDER") for d in divs] == ["1", "2", "3"] and divs[1].get("LABEL").startswith("page 2 failed")
    pdf = pdfium.PdfDocument((out / "gapped.pdf").read_bytes())
    try:
        assert len(pdf) == 3 and "page 2 failed" in pdf[1].get_textpage().get_text_range()
    finally:
        pdf.close()
    assert "page 2 failed" in (out / "gapped.md").read_text()
    assert json.loads((out / "gapped.json").read_text())["failed_pages"] == [2]


@pytest.mark.slow
def test_a_real_two_column_page_reads_column_by_column(real_run: RunOutput) -> None:
    _, truth = render_columns(2, seed=5, rows=8)
    from tests.scoring import cer

    assert cer(real_run.results["columns"].text, truth) < 0.05
    assert len(real_run.results["columns"].blocks) >= 4  # title, two paragraphs in each column, footnote


# -- the corpus ------------------------------------------------------------------------------------------

@pytest.mark.corpus
@pytest.mark.slow
@pytest.mark.parametrize("pick", [lambda root: sroie_pages(root, limit=1)[0],
                                  lambda root: funsd_pages(root, limit=1)[0]], ids=["sroie-receipt", "funsd-form"])
def test_real_scans_of_the_corpus_give_valid_formats(pick: Callable[[Path], Any], alto_schema: Any,
                                                     page_schema: Any, tmp_path: Path) -> None:
    root = corpus_root()
    if not root.is_dir():
        pytest.skip(f"corpus not found at {root}")
    image = pick(root).image
    result = PageResult.model_validate(run_paperlane([image], tmp_path, timeout=600)[image.stem])
    made = _check_page(result, alto_schema, page_schema)
    assert _hocr_consumer_words(made[OutputFormat.HOCR], tmp_path) == result.text.split()
