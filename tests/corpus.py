"""Ground truth of the development corpus (``../shared/corpus``): SROIE receipts and FUNSD forms.

The scans are evaluation data and never live in this repository; see the corpus README.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.scoring import Box, cer, cer_nospace, detection_matches, normalise, quad_to_box, reading_order

REPO = Path(__file__).resolve().parent.parent
PAPERLANE = [sys.executable, "-m", "paperlane"]


@dataclass(frozen=True)
class TruthLine:
    text: str
    box: Box


@dataclass(frozen=True)
class TruthPage:
    """One scanned page with its lines in reading order and, for SROIE, the key fields."""

    name: str
    image: Path
    lines: tuple[TruthLine, ...]
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "\n".join(line.text for line in self.lines)

    @property
    def boxes(self) -> list[Box]:
        return [line.box for line in self.lines]


def corpus_root(explicit: str | Path | None = None) -> Path:
    """The corpus: ``explicit``, else env ``PAPERLANE_CORPUS``, else ``shared/corpus`` beside the repo."""
    return Path(explicit or os.environ.get("PAPERLANE_CORPUS") or REPO.parent / "shared" / "corpus")


def _ordered(lines: list[TruthLine]) -> tuple[TruthLine, ...]:
    return tuple(lines[k] for k in reading_order([line.box for line in lines]))


def _parse_sroie_row(row: str) -> TruthLine | None:
    parts = row.split(",", 8)
    if len(parts) < 9 or not parts[8].strip():
        return None
    xs, ys = [float(v) for v in parts[0:8:2]], [float(v) for v in parts[1:8:2]]
    return TruthLine(parts[8].strip(), (min(xs), min(ys), max(xs), max(ys)))


def sroie_pages(root: Path, *, limit: int | None = None) -> list[TruthPage]:
    """SROIE receipts under ``root/sroie-dev``: truth lines from ``box/*.csv``, fields from ``key/*.json``."""
    base = root / "sroie-dev"
    pages = []
    for csv in sorted((base / "box").glob("*.csv"))[:limit]:
        rows = csv.read_text(encoding="utf-8-sig").splitlines()  # splitlines also eats CRLF
        lines = [line for row in rows if (line := _parse_sroie_row(row)) is not None]
        key = base / "key" / f"{csv.stem}.json"
        fields = json.loads(key.read_text(encoding="utf-8")) if key.exists() else {}
        pages.append(TruthPage(csv.stem, base / "img" / f"{csv.stem}.jpg", _ordered(lines), fields))
    return pages


def _union(boxes: list[Box]) -> Box:
    x0, y0, x1, y1 = zip(*boxes, strict=True)
    return min(x0), min(y0), max(x1), max(y1)


def _split_rows(words: list[TruthLine]) -> list[TruthLine]:
    """Cut one FUNSD entity's words into printed lines (multi-line answers and headers are one entity):
    a word starts a new line when it overlaps the current line vertically by less than half its height."""
    rows: list[list[TruthLine]] = []
    for w in words:
        if rows:
            _, top, _, bottom = _union([x.box for x in rows[-1]])
            if min(bottom, w.box[3]) - max(top, w.box[1]) >= 0.5 * min(bottom - top, w.box[3] - w.box[1]):
                rows[-1].append(w)
                continue
        rows.append([w])
    return [TruthLine(" ".join(w.text for w in row), _union([w.box for w in row])) for row in rows]


def funsd_pages(root: Path, *, limit: int | None = None) -> list[TruthPage]:
    """FUNSD forms under ``root/funsd-dev``: one truth line per printed line of each entity."""
    base = root / "funsd-dev"
    pages = []
    for ann in sorted((base / "annotations").glob("*.json"))[:limit]:
        lines: list[TruthLine] = []
        for entity in json.loads(ann.read_text(encoding="utf-8"))["form"]:
            words = [TruthLine(w["text"].strip(), tuple(map(float, w["box"])))  # type: ignore[arg-type]
                     for w in entity["words"] if w["text"].strip()]
            lines += _split_rows(words)
        pages.append(TruthPage(ann.stem, base / "images" / f"{ann.stem}.png", _ordered(lines)))
    return pages


SETS = {"sroie": sroie_pages, "funsd": funsd_pages}


def run_paperlane(images: Sequence[Path], workdir: Path, *, timeout: float = 3600,
                  args: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """Run ``paperlane run`` (with ``args``) on ``images`` with cwd ``workdir``, into ``workdir/out``; the page
    JSON per image stem.

    A page without output comes back as a failed result carrying the tail of the command's stderr.
    """
    out = workdir / "out"
    # exit status 1 only means some page failed; each page's JSON says which
    proc = subprocess.run([*PAPERLANE, "run", *map(str, images), "--out", str(out), *args], cwd=workdir,
                          capture_output=True, text=True, timeout=timeout, check=False)
    error = f"no output (rc={proc.returncode}): {proc.stderr[-2000:]}"
    missing = {"status": "missing", "error": error, "text": "", "lines": []}
    return {img.stem: json.loads(p.read_text()) if (p := out / f"{img.stem}.json").exists() else missing
            for img in images}


@dataclass(frozen=True)
class PageScore:
    name: str
    ok: bool
    cer: float
    cer_nospace: float
    predicted: int  # line boxes
    truth: int
    matched: int  # one-to-one at the IoU threshold
    total_found: bool | None  # SROIE only: the normalised total appears in the normalised text


def score_page(truth: TruthPage, result: Mapping[str, Any], *, iou: float = 0.5) -> PageScore:
    """Compare one ``paperlane run`` page JSON with its ground truth."""
    ok = result.get("status") == "succeeded"
    text = str(result.get("text") or "") if ok else ""
    pred = [quad_to_box(line["quad"]) for line in result.get("lines") or []] if ok else []
    total = truth.fields.get("total")
    return PageScore(
        name=truth.name, ok=ok, cer=cer(text, truth.text), cer_nospace=cer_nospace(text, truth.text),
        predicted=len(pred), truth=len(truth.lines), matched=detection_matches(pred, truth.boxes, iou=iou),
        total_found=None if total is None else normalise(total) in normalise(text),
    )
