"""The annotated image: drawn on the preview, JPEG by default, PNG or WebP on request, named for its format."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from paperlane.producer.inputs import Document
from paperlane.schemas import Line, TaskSpec
from paperlane.settings import ImageFormat, Settings, WorkerSettings
from paperlane.storage import jobs as jobstore
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
