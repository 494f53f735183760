"""``paperlane run`` on a few real scans of the corpus: every page succeeds, the text is close to the truth.

Measured with the bundled RapidOCR engine (2 CPU cores, 32 pages: benchmarks/accuracy.py): SROIE mean CER
0.053, FUNSD 0.088. On the 8 pages below mean CER was 0.057 (worst page 0.177, SROIE 001), so the
thresholds leave roughly a 1.75x margin for engine or preprocessing drift.
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean

import pytest

from tests.corpus import corpus_root, funsd_pages, run_paperlane, score_page, sroie_pages

ROOT = corpus_root()
MAX_MEAN_CER = 0.10
MAX_PAGE_CER = 0.35

pytestmark = [
    pytest.mark.corpus,
    pytest.mark.slow,
    pytest.mark.skipif(not ROOT.is_dir(), reason=f"corpus folder absent: {ROOT}"),
]


def test_run_on_real_scans(tmp_path: Path) -> None:
    truth = sroie_pages(ROOT, limit=5) + funsd_pages(ROOT, limit=3)
    assert len(truth) == 8
    results = run_paperlane([t.image for t in truth], tmp_path, timeout=900)
    scores = [score_page(t, results[t.image.stem]) for t in truth]

    failed = {s.name: results[s.name].get("error") for s in scores if not s.ok}
    assert not failed
    report = {s.name: round(s.cer, 4) for s in scores}
    assert mean(s.cer for s in scores) < MAX_MEAN_CER, report
    assert max(s.cer for s in scores) < MAX_PAGE_CER, report
    totals = [s.total_found for s in scores if s.total_found is not None]
    assert sum(totals) >= len(totals) - 1, report  # the receipt total is read on (nearly) every receipt
