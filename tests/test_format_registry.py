"""The formats registry is the only dispatch: every registered format is built by ``formats.build`` and reached
through each caller (the worker's outputs, the API's ``?format=``, ``paperlane run``, the CLI), no module outside
the package names a format to branch on it or spells its media type, and a METS references only files that exist
where it is written, or the original where the store keeps it."""

from __future__ import annotations

import asyncio
import io
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx
import numpy as np
import pytest
from lxml import etree
from PIL import Image

from paperlane.errors import UsageError
from paperlane.formats import FORMATS, REGISTRY, Content, Scope, build, file_name, format_of, media_type
from paperlane.retry import RetryPolicy
from paperlane.schemas import EngineInfo, JobStatus, Line, OutputFormat, PageResult
from paperlane.storage import ingests, tenants
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database
from paperlane.storage.objects import ObjectStore, document_key, open_store, result_key
from paperlane.storage.results import original_location
from paperlane.workers.outputs import Writer
from tests.conftest import Stack, cli
from tests.pages import render_page, sample_lines, tiny_page
from tests.test_ingests import doc
from tests.test_tenants import _submit

REPO = Path(__file__).resolve().parents[1]
XLINK_HREF = "{http://www.w3.org/1999/xlink}href"
METS_FLOCAT = "{http://www.loc.gov/METS/}FLocat"


def _result(page: int, text: str = "Total 12.00") -> PageResult:
    return PageResult(job_id=f"job-{page}", source="scan.png", page=page, status=JobStatus.SUCCEEDED, text=text,
                      lines=[Line(text=text, confidence=0.9, quad=[(10, 10), (300, 10), (300, 40), (10, 40)])],
                      width=360, height=64, engine=EngineInfo(name="stub", version="0"))


# -- the registry, alone -------------------------------------------------------------------------------------

def test_build_makes_every_registered_form_and_refuses_every_other() -> None:
    content = Content([_result(1), _result(2)], name="scan", ext=".png", document_id="d",
                      preview=np.full((32, 180), 255, np.uint8))
    for key, spec in REGISTRY.items():
        for scope in Scope:
            page = 1 if scope is Scope.PAGE else None
            if scope not in spec.scopes:
                with pytest.raises(UsageError):
                    build(key, content, page=page)
                continue
            data = build(key, content, page=page)
            assert data, (key, scope)
            if spec.module == "annotated":  # each encoding is its own format, and its bytes say which
                assert format_of(data) is key
    assert set(FORMATS) == set(OutputFormat)
    assert len({spec.extension for spec in REGISTRY.values()}) == len(REGISTRY)  # no two formats share a file name


# Formats named outside the package: reading or writing legacy columns and view fields (not choosing how to
# build), the settings' defaults, and the enums' own modules.
_MAY_NAME_FORMATS = {"paperlane/schemas.py", "paperlane/settings.py", "storage/outputs.py", "storage/views.py"}
_NAMED_FORMAT = re.compile(r"OutputFormat\.(MD|PDF|ALTO|PAGE|HOCR|METS)\b|ImageFormat\.(JPEG|PNG|WEBP)\b"
                           r"|[\"'](alto|hocr|mets)[\"']|(==|!=|\bis)\s*[\"'](md|pdf|page)[\"']"
                           r"|[\"']\.(alto\.xml|page\.xml|hocr|mets\.xml)[\"']|\.annotated\.\{")
# Media types of outputs, spelled in the modules that build or serve them.
_MEDIA_TYPE = re.compile(r"[\"'](application/(json|pdf|xml|xhtml\+xml)|text/markdown[^\"']*|image/(jpeg|png|webp))"
                         r"[\"']")
_CALLERS = ("workers/outputs.py", "workers/embedded.py", "workers/pipeline.py", "producer/api/files.py",
            "producer/api/pages.py", "producer/api/documents.py", "storage/results.py", "storage/objects.py",
            "paperlane/cli.py", "paperlane/settings.py")


def _sources() -> list[tuple[str, str]]:
    found = []
    for folder in ("paperlane", "producer", "workers", "storage", "priority", "models"):
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if not rel.startswith("paperlane/formats/") and "/migrations/" not in rel:
                found.append((rel, path.read_text()))
    return found


def test_no_module_outside_the_package_dispatches_on_a_format() -> None:
    """A second ``if fmt == "alto"`` chain, a format's extension or an output's media type outside
    paperlane.formats is the first sign of drift: the registry is where a format is looked up."""
    named = [f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for rel, text in _sources()
             if rel not in _MAY_NAME_FORMATS for m in _NAMED_FORMAT.finditer(text)]
    assert not named, "\n".join(named)
    spelled = [f"{rel}: {m.group(0)}" for rel, text in _sources() if rel in _CALLERS
               for m in _MEDIA_TYPE.finditer(text)]
    assert not spelled, "\n".join(spelled)
    imported = [f"{rel}: {m.group(0)}" for rel, text in _sources()
                for m in re.finditer(r"paperlane\.formats\.(alto|hocr|pagexml|mets|pdf|pdf_text|markdown|"
                                     r"result_json|annotated)\b", text)]
    assert not imported, "callers go through paperlane.formats, not a format's module:\n" + "\n".join(imported)


def test_the_package_imports_nothing_from_the_layers_that_use_it() -> None:
    """paperlane.formats is a lower layer: whatever builds a format can import it, and it imports none of them."""
    upper = re.compile(r"^\s*(from|import)\s+paperlane\.(workers|producer|storage|priority|cli)\b", re.MULTILINE)
    found = [f"{path.name}: {m.group(0).strip()}" for path in sorted((REPO / "paperlane" / "formats").glob("*.py"))
             for m in upper.finditer(path.read_text())]
    assert not found, "\n".join(found)
    assert upper.search("from paperlane.storage.objects import ObjectStore")  # the pattern can fail


def test_the_grep_finds_a_chain() -> None:
    """The test above can fail: each pattern catches what it is there for."""
    for chain in ('if fmt == "alto":', "elif fmt is OutputFormat.METS:", 'name + ".page.xml"',
                  'f"{name}.annotated.{fmt.suffix}"', "if fmt != 'pdf':"):
        assert _NAMED_FORMAT.search(chain), chain
    assert _MEDIA_TYPE.search('content_type="application/json"')


# -- every caller reaches every format -----------------------------------------------------------------------

def _finished(db: Database, store: ObjectStore, name: str, pages: int, owner: ingests.Owner) -> tuple[str, list[str]]:
    """A document of ``pages`` pages, each page succeeded with a stored result: its id and its page ids."""
    submitted = _submit(db, store, [doc(name, tiny_page(len(name)), pages=pages)], owner)  # type: ignore[arg-type]
    for page in submitted:
        job = jobstore.start_attempt(db, page.job_id, policy=RetryPolicy())
        assert job is not None
        result = _result(page.page_no, f"{name} page {page.page_no}")
        store.put(result_key(page.job_id), result.model_dump_json().encode())
        jobstore.finish_succeeded(db, job, result, engine="stub", result_key=result_key(page.job_id),
                                  annotated_key=None, timings={})
    return submitted[0].document_id, [p.page_id for p in submitted]


def _store_key(store: ObjectStore, url: str) -> str:
    """The key an ``s3://`` or ``file:`` URL of ``store`` names (its fragment dropped)."""
    base = store.url("")
    if url.startswith("file:"):
        base, url = Path(base).absolute().as_uri() + "/", url
    assert url.startswith(base), (url, base)
    return unquote(urlsplit(url[len(base):]).path)


def _hrefs(mets: bytes) -> list[str]:
    return [f.get(XLINK_HREF) for f in etree.fromstring(mets).iter(METS_FLOCAT)]


def test_the_worker_and_the_api_reach_every_format_and_their_mets_resolves(stack: Stack) -> None:
    db, store = Database(stack.settings.database_url), open_store(stack.settings)
    db.upgrade()
    key = tenants.create_key(db, tenant="formats")
    owner = ingests.Owner(key.tenant_id, key.key_id, None)
    document_id, page_ids = _finished(db, store, "book", 2, owner)
    written = Writer(db, store, RetryPolicy(), hold=30, formats=tuple(OutputFormat)).write(document_id)
    assert written is not None and written.formats == list(OutputFormat)  # the worker: every document format

    # The METS the worker wrote: its page files beside it in the store, its images the original where it is kept.
    original = original_location(store, ingests.get_document(db, document_id).original_key or "")
    hrefs = _hrefs(store.get(document_key(document_id, OutputFormat.METS)))
    assert [h for h in hrefs if "://" in h] == [f"{original}&page={n}" for n in (1, 2)]
    for href in hrefs:
        assert store.exists(_store_key(store, href) if "://" in href else f"documents/{href}"), href

    built_id, built_pages = _finished(db, store, "leaflet", 2, owner)  # its outputs: JSON only
    assert Writer(db, store, RetryPolicy(), hold=30, formats=(OutputFormat.JSON,)).write(built_id) is not None
    asyncio.run(_through_the_api(stack, store, key.key, (document_id, page_ids), (built_id, built_pages)))


async def _through_the_api(stack: Stack, store: ObjectStore, key: str, written: tuple[str, list[str]],
                           built: tuple[str, list[str]]) -> None:
    """Every document format through ``?format=`` (and each page's alone), and a METS the API builds."""
    from paperlane.producer.api.app import create_app

    (document_id, page_ids), (built_id, built_pages) = written, built
    app = create_app(stack.settings, webhooks=False)
    auth = {"Authorization": f"Bearer {key}"}
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                                                   base_url="http://api", headers=auth) as api:
        for fmt, spec in FORMATS.items():  # the API's ?format=: every document format
            params = {"format": fmt.value, **({} if spec.document else {"page": "2"})}
            got = await api.get(f"/v1/documents/{document_id}/result", params=params)
            assert got.status_code == 200, (fmt, got.text)
            assert got.headers["content-type"] == media_type(fmt)
            name = file_name("book", fmt, None if spec.document else 2, 2)
            assert got.headers["content-disposition"] == f'inline; filename="{name}"'
            if spec.page and spec.archive:  # and a page alone
                alone = await api.get(f"/v1/pages/{page_ids[0]}", params={"format": fmt.value})
                assert alone.status_code == 200 and alone.headers["content-type"] == media_type(fmt), fmt
        # A METS the API builds (no worker wrote it): its page files at this API's URLs, which answer.
        mets = await api.get(f"/v1/documents/{built_id}/result", params={"format": "mets"})
        assert mets.status_code == 200, mets.text
        hrefs = _hrefs(mets.content)
        assert [h for h in hrefs if h.startswith("/v1/")] == [
            f"/v1/pages/{built_pages[n - 1]}?format={fmt}" for fmt in ("alto", "page") for n in (1, 2)]
        for href in hrefs:
            if href.startswith("/v1/"):
                assert (await api.get(href)).status_code == 200, href
            else:
                assert store.exists(_store_key(store, href)), href


@pytest.mark.slow
def test_run_writes_every_format_and_its_mets_resolves(embedded: Stack, tmp_path: Path) -> None:
    names = ",".join(fmt.value for fmt in FORMATS)
    helped = cli(embedded, "run", "--help")
    assert all(fmt.value in helped.stdout for fmt in FORMATS), helped.stdout  # the CLI: every format by name
    src = tmp_path / "in"
    src.mkdir()
    pages = [Image.open(io.BytesIO(render_page(sample_lines(i, 2)))).convert("RGB") for i in (3, 4)]
    pages[0].save(src / "two.pdf", save_all=True, append_images=pages[1:], resolution=150)
    (src / "r132.png").write_bytes(render_page(sample_lines(5, 2)))
    out = tmp_path / "out"
    proc = cli(embedded, "run", str(src), "--out", str(out), "--formats", names)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for stem, count in (("two", 2), ("r132", 1)):
        for fmt, spec in FORMATS.items():  # paperlane run: every document format, named by file_name
            wanted = [file_name(stem, fmt)] if spec.document else [file_name(stem, fmt, n, count)
                                                                   for n in range(1, count + 1)]
            assert all((out / name).is_file() for name in wanted), (fmt, wanted, sorted(p.name for p in out.iterdir()))
        annotated = [file_name(stem if count == 1 else f"{stem}-p{n}", embedded.settings.worker.annotated_format)
                     for n in range(1, count + 1)]
        assert all((out / name).is_file() for name in annotated), annotated
        hrefs = _hrefs((out / file_name(stem, OutputFormat.METS)).read_bytes())
        images = [h for h in hrefs if h.startswith("file:")]
        assert len(images) == count  # not "two.pdf#page=1" beside it: there that is the searchable PDF
        for href in hrefs:  # beside the METS, or the original where the run's store keeps it
            path = Path(unquote(urlsplit(href).path)) if href.startswith("file:") else out / href
            assert path.is_file(), href
            if href.startswith("file:"):
                assert path.is_relative_to(embedded.settings.storage_root.resolve()), href
