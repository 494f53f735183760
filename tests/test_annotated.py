"""The annotated image: drawn on the preview, JPEG by default, PNG or WebP on request, named for its format; drawn as
a page finishes or when it is first asked for."""

from __future__ import annotations

import io
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from paperlane.producer.input_items import Document
from paperlane.schemas import Line, TaskSpec
from paperlane.settings import ImageFormat, Settings, WorkerSettings
from paperlane.storage import jobs as jobstore
from paperlane.storage.results import page_result
from paperlane.workers.drawing import drawn_by_worker, drawn_on_request
from paperlane.workers.embedded import run_embedded
from paperlane.workers.pipeline import Runtime
from paperlane.formats.annotated import annotate, format_of
from tests.pages import render_page, sample_lines
from tests.test_page_failures import StubEngine

LINES = [Line(text="total", confidence=0.9, quad=[(100.0, 100.0), (900.0, 100.0), (900.0, 160.0), (100.0, 160.0)]),
         Line(text="t0ta1", confidence=0.2, quad=[(100.0, 300.0), (900.0, 300.0), (900.0, 360.0), (100.0, 360.0)])]


@pytest.mark.parametrize("fmt", list(ImageFormat))
def test_annotated_image_in_each_format(fmt: ImageFormat) -> None:
    preview = np.full((600, 424), 240, np.uint8)  # a 1240x1754 page at about a third
    data = annotate(preview, LINES, page_width=1240, page_height=1754, fmt=fmt)
    assert format_of(data) is fmt
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert img.shape == (600, 424, 3)
    # The first line's outline is green, the doubtful one's red, where the page's pixels map to.
    green, red = img[34, 100].astype(int), img[103, 100].astype(int)
    assert green[1] > green[0] + 30 and green[1] > green[2] + 30, green  # JPEG blurs a 1 px line's colour
    assert red[2] > red[0] + 30 and red[2] > red[1] + 30, red


def test_engine_coordinates_that_are_nonsense_draw_nothing_useful_but_do_not_raise() -> None:
    odd = [Line(text="a", quad=[(float("nan"), 1e300), (5.0, 5.0), (9.0, 9.0), (1.0, 1.0)]),
           Line(text="b", quad=[(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)]), Line(text="c"),
           Line(text="d", quad=[(1e30, -1e30)])]
    assert format_of(annotate(np.zeros((50, 40), np.uint8), odd, page_width=400, page_height=500)) is ImageFormat.JPEG


def test_png_on_request_and_a_later_run_keeps_each_pages_format(tmp_path: Path) -> None:
    def run(fmt: ImageFormat, out: Path, pages: list[tuple[str, bytes]]) -> Runtime:
        settings = Settings(data_dir=tmp_path / "data", worker=WorkerSettings(annotated_format=fmt,
                                                                             preprocess_processes=0))
        rt = Runtime.start(settings, engine=StubEngine())  # type: ignore[arg-type]
        try:
            inputs = [Document(source=f"{n}.png", name=n, ext=".png", data=d, page_count=1) for n, d in pages]
            assert run_embedded(rt, inputs, out_dir=out, spec=TaskSpec()).failed == 0
        finally:
            rt.close()
        return rt

    first, second = ("first", render_page(sample_lines(1))), ("second", render_page(sample_lines(2)))
    rt = run(ImageFormat.PNG, tmp_path / "a", [first])
    assert format_of((tmp_path / "a/first.annotated.png").read_bytes()) is ImageFormat.PNG
    [row] = jobstore.get_jobs(rt.db, [r.id for r in _all_jobs(rt)])
    assert row.annotated_key == f"annotated/{row.id}.png"
    # Back to the default: the page done before is copied out as the PNG it is, the new one is a JPEG.
    run(ImageFormat.JPEG, tmp_path / "b", [first, second])
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [
        "first.annotated.png", "first.json", "first.md", "first.pdf",
        "second.annotated.jpg", "second.json", "second.md", "second.pdf"]


def _all_jobs(rt: Runtime) -> list:
    from sqlalchemy import select

    from paperlane.storage.tables import JobRow

    with rt.db.session() as s:
        return list(s.scalars(select(JobRow)))


def test_drawn_on_request_is_the_image_the_worker_would_have_drawn(tmp_path: Path) -> None:
    """``worker.annotated`` on_request: a page's image drawn later from its stored original (here page 2 of a PDF) and
    its result is the one the worker draws as the page finishes (stored)."""
    pages = [Image.open(io.BytesIO(render_page(sample_lines(i, 3)))).convert("RGB") for i in (4, 5)]
    buf = io.BytesIO()
    pages[0].save(buf, format="PDF", save_all=True, append_images=pages[1:], resolution=150)
    settings = Settings(data_dir=tmp_path / "data", worker=WorkerSettings(annotated="stored", preprocess_processes=0))
    rt = Runtime.start(settings, engine=StubEngine())  # type: ignore[arg-type]
    try:
        doc = Document(source="two.pdf", name="two", ext=".pdf", data=buf.getvalue(), page_count=2)
        assert run_embedded(rt, [doc], out_dir=tmp_path / "out", spec=TaskSpec()).failed == 0
        [job] = [j for j in _all_jobs(rt) if j.page == 2]
        result = page_result(rt.store, job, source="two.pdf", page_no=2)
        later = drawn_on_request(rt.store, job, result, settings)
        worker = rt.store.get(job.annotated_key)
    finally:
        rt.close()
    drawn, stored = (cv2.imdecode(np.frombuffer(d, np.uint8), cv2.IMREAD_COLOR).astype(int) for d in (later, worker))
    # The worker's preview is cut from the page as the engine takes it (sides rounded to the engine's multiple):
    # the same page within a few pixels, and the same outline where the line is.
    assert drawn.shape[1] == stored.shape[1] == settings.worker.annotated_max_side
    assert abs(drawn.shape[0] - stored.shape[0]) <= 0.03 * stored.shape[0]
    alike = cv2.resize(drawn.astype(np.uint8), stored.shape[1::-1], interpolation=cv2.INTER_AREA).astype(int)
    assert np.abs(alike - stored).mean() < 3.0
    assert (drawn[..., 1] > drawn[..., 2] + 30).sum() > 100  # the stub's line, outlined in green


def test_a_worker_cuts_no_preview_unless_it_draws_as_pages_finish() -> None:
    """Unset, ``worker.annotated`` is on_request for a worker (its pages are stored, not written out) and stored for
    ``paperlane run`` (it writes the image beside each page's JSON); set, it is what it says for both."""
    assert drawn_by_worker(Settings(), files=True) and not drawn_by_worker(Settings(), files=False)
    for when, drawn in (("stored", True), ("on_request", False)):
        settings = Settings(worker=WorkerSettings(annotated=when))
        assert drawn_by_worker(settings, files=True) is drawn and drawn_by_worker(settings, files=False) is drawn
