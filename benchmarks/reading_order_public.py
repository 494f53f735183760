"""The public half of ``benchmarks/reading_order.py``: pages nobody tuned for (``--public DIR``).

A folder is read as HRDoc's when ``hrdoc_pages.is_hrdoc`` says so (a ``<doc>.json`` beside a ``<doc>/``
folder), as DocBank's when ``docbank_pages.is_docbank`` does (``<paper>_<p>.txt`` beside ``<paper>_<p>_ori.jpg``),
else as OmniDocBench's; either loader gives the same pages and truth, scored the same way.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

from benchmarks import docbank_pages, docbank_papers, hrdoc_pages, public_pages
from benchmarks.public_pages import PublicPage, char_f1, region_order_distance, word_f1
from paperlane.gutters import split_at_gutters
from paperlane.layout import order_lines, quad_box
from paperlane.models.engine import EngineOutput, EngineRequest
from paperlane.models.rapid import RapidEngine
from paperlane.regions import Found, order_regions
from paperlane.schemas import Line, TaskSpec
from paperlane.workers.postprocess import regions_to_original, to_original
from paperlane.workers.preprocess import prepare_page
from tests.scoring import cer_nospace

Order = Callable[[list[Line], list[Found], PublicPage], list[Line]]


@dataclass
class Score:
    page: str
    half: str
    group: str
    language: str
    cer: float
    best: float
    chars: float
    words: float
    regions: float
    cpu_ms: float


def read_page(page: PublicPage, engine: RapidEngine, cache: Path | None) -> tuple[list[Line], list[Found]]:
    """The engine's lines and layout regions of a page in original pixels (from ``cache`` when it has them)."""
    key = page.name if page.scale == 1 else f"{page.name}@{page.scale}x"
    stored = cache / f"{key}.{engine.info.version}.page.json" if cache else None
    if stored and stored.exists():
        data = json.loads(stored.read_text())
        return ([Line.model_validate(d) for d in data["lines"]],
                [Found(k, tuple(b)) for k, b in data["regions"]])  # type: ignore[arg-type]
    prepared = prepare_page(page.image_bytes(), engine.input_spec)
    t0 = time.process_time()
    [out] = engine.infer([EngineRequest(image=prepared.image, spec=TaskSpec())])
    engine_cpu = time.process_time() - t0
    assert isinstance(out, EngineOutput), out
    size = (prepared.width, prepared.height)
    lines = to_original(out.lines, prepared.image, size)
    regions = regions_to_original(out.regions, prepared.image, size)
    if stored:
        stored.parent.mkdir(parents=True, exist_ok=True)
        stored.write_text(json.dumps({"lines": [ln.model_dump(mode="json") for ln in lines],
                                      "regions": [(r.kind, r.box) for r in regions], "engine_cpu_s": engine_cpu}))
    return lines, regions


def kept(lines: list[Line], page: PublicPage) -> list[Line]:
    """The lines whose centre is not in an area the truth leaves out (tables, figures, formulas, margins)."""
    out = []
    for ln in lines:
        x0, y0, x1, y1 = quad_box(ln.quad or [])
        if not page.excluded(((x0 + x1) / 2, (y0 + y1) / 2)):
            out.append(ln)
    return out


def best_order(lines: list[Line], page: PublicPage) -> list[Line]:
    """The best order these lines allow: by the true block each overlaps most, in the order given within one;
    lines in no true block last."""
    where = [page.block_of(quad_box(ln.quad or [])) for ln in lines]
    ranked = sorted(range(len(lines)), key=lambda i: (where[i] is None, where[i] or 0, i))
    return [lines[i] for i in ranked]


def score(page: PublicPage, lines: list[Line], regions: list[Found], order: Order, *, split: bool) -> Score:
    """The page's figures in ``order``; with ``split``, its lines are first cut at gutters as the pipeline cuts
    them (``gutters.split_at_gutters``, timed with the order). Every line the engine found is ordered, as the
    pipeline orders them, and those in areas the truth leaves out are then dropped from the text scored (ordering
    only the kept lines would make another page: one where a table's or a figure's text is not there to keep a
    column whole). The best order is that of the same kept lines, in the engine's order within each true block."""
    t0 = time.process_time()
    if split:
        lines = split_at_gutters(lines)
    ordered = order(lines, regions, page)
    cpu = (time.process_time() - t0) * 1000
    ordered, lines = kept(ordered, page), kept(lines, page)
    text = "\n".join(ln.text for ln in ordered)
    truth = page.text
    visits = [v for v in (page.block_of(quad_box(ln.quad or [])) for ln in ordered) if v is not None]
    return Score(page.name, page.half, page.group, page.language, cer_nospace(text, truth),
                 cer_nospace("\n".join(ln.text for ln in best_order(lines, page)), truth),
                 char_f1(text, truth), word_f1(text, truth), region_order_distance(visits, len(page.truth)), cpu)


def geometry_order(lines: list[Line], regions: list[Found], page: PublicPage) -> list[Line]:
    """paperlane's order from the lines' geometry alone (``layout.order_lines``), as before layout regions."""
    return order_lines(lines)[0]


def region_order(lines: list[Line], regions: list[Found], page: PublicPage) -> list[Line]:
    """paperlane's order over the layout model's regions (``regions.order_regions``), as the pipeline has it
    (lines cut at gutters first)."""
    return order_regions(lines, regions, page_size=page.size)[0]


def load(root: Path) -> list[PublicPage]:
    """The pages of a public folder, HRDoc's, DocBank's or OmniDocBench's."""
    if hrdoc_pages.is_hrdoc(root):
        return hrdoc_pages.load(root)
    return docbank_pages.load(root) if docbank_pages.is_docbank(root) else public_pages.load(root)


def run(roots: Sequence[Path], *, cache: Path | None, per_page: bool,
        halves: tuple[str, ...] = ("develop", "measure"), papers: Sequence[Path] = (),
        papers_dpi: Sequence[int] = (), per_paper: int | None = None) -> None:
    """Print each group's figures (OmniDocBench's halves, HRDoc's layouts) under both orders."""
    engine = RapidEngine(layout_model="auto")
    engine.start()
    found = [page for root in roots for page in load(root) if page.half in halves]
    if "develop" in halves:  # the develop papers' other pages, or papers from elsewhere (docbank_papers)
        rendered = (cache or Path(tempfile.mkdtemp())) / "docbank-papers"
        found += [page for folder in papers for dpi in papers_dpi
                  for page in docbank_papers.load(folder, rendered, dpi=dpi, per_paper=per_paper)]
    pages = [(page, *read_page(page, engine, cache)) for page in found]
    groups = [*halves, *sorted({page.group for page in found} - set(halves))]
    for name, order, split in (("geometry", geometry_order, False), ("regions", region_order, True)):
        scores = [score(page, lines, regions, order, split=split) for page, lines, regions in pages]
        print(f"== {name}: {order.__doc__.splitlines()[0]}")
        if per_page:
            for s in scores:  # the pages only measured on are summed up, never shown one by one
                if s.half == "develop":
                    print(f"  {s.language[:7]:7} cer={s.cer:.3f} best={s.best:.3f} regions={s.regions:.3f} "
                          f"chars_f1={s.chars:.3f} {s.page[:60]}")
        for group in groups:
            summary(f"{name}-{group}", [s for s in scores if s.group == group])


def summary(name: str, scores: list[Score]) -> None:
    if not scores:
        return
    langs = sorted({s.language for s in scores})
    by_lang = " ".join(f"cer_{lang}={mean(s.cer for s in scores if s.language == lang):.3f}" for lang in langs)
    print(f"public-{name}: pages={len(scores)} ordered_cer={mean(s.cer for s in scores):.3f} "
          f"best_order_cer={mean(s.best for s in scores):.3f} "
          f"ratio={mean(s.cer for s in scores) / max(1e-9, mean(s.best for s in scores)):.2f} "
          f"char_f1={mean(s.chars for s in scores):.3f} word_f1={mean(s.words for s in scores):.3f} "
          f"region_order_edit={mean(s.regions for s in scores):.3f} order_cpu_ms={mean(s.cpu_ms for s in scores):.1f} "
          f"{by_lang}", flush=True)
