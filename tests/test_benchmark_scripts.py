"""Every benchmark script still starts: its imports resolve against today's code and its options parse.

Two of them (cost_per_page, sweep_cost) had imported names the code no longer has, and nobody knew until a figure
was wanted. Running each with ``--help`` costs a second and catches that.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

_BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
_SCRIPTS = sorted(p for p in _BENCHMARKS.glob("*.py") if 'if __name__ == "__main__"' in p.read_text())


def test_the_benchmark_scripts_are_found() -> None:
    assert {"engine_utilisation.py", "status_scale.py", "sweep_cost.py", "cost_per_page.py"} <= {
        p.name for p in _SCRIPTS}


@pytest.mark.processes
@pytest.mark.parametrize("script", _SCRIPTS, ids=[p.stem for p in _SCRIPTS])
def test_a_benchmark_script_starts(script: Path) -> None:
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120,
                          cwd=_BENCHMARKS.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
