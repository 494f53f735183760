"""paperlane installs as one package: its step folders import as ``paperlane.<step>``, layered bottom-up
(import-linter's contracts, ``[tool.importlinter]`` in pyproject.toml)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

@pytest.mark.processes
def test_no_package_imports_one_above_it() -> None:
    """The layers and the formats' and engines' independence: import-linter's contracts in pyproject.toml."""
    checked = subprocess.run([str(REPO / "scripts" / "lint-imports")], capture_output=True, text=True,
                             env={**os.environ, "PYTHON": sys.executable})
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "0 broken" in checked.stdout and "2 kept" in checked.stdout


@pytest.mark.processes
@pytest.mark.parametrize("name", ["models", "storage", "workers", "producer", "priority"])
def test_generic_top_level_names_are_not_installed(name: str, tmp_path: Path) -> None:
    outside = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=tmp_path, capture_output=True, text=True)
    assert outside.returncode != 0 and "No module named" in outside.stderr
    inside = subprocess.run([sys.executable, "-c", f"import paperlane.{name}"], cwd=tmp_path, capture_output=True,
                            text=True)
    assert inside.returncode == 0, inside.stderr
