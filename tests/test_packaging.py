"""paperlane installs as one package: its step folders import as ``paperlane.<step>``, layered bottom-up
(import-linter's contracts, ``[tool.importlinter]`` in pyproject.toml)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Each step folder and the package it installs as (pyproject's [tool.setuptools.package-dir]).
FOLDERS = {"paperlane": "paperlane", "producer": "paperlane.producer", "priority": "paperlane.priority",
           "workers": "paperlane.workers", "models": "paperlane.models", "storage": "paperlane.storage"}


def _modules() -> list[tuple[str, Path]]:
    found = []
    for folder, package in FOLDERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found.append((".".join([package, *parts]), path))
    return found


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


def test_every_package_is_listed_for_setuptools() -> None:
    """A subpackage left out of pyproject's list is missing from the installed wheel (an editable install hides it)."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {module for module, path in _modules() if path.name == "__init__.py"}
    assert found == listed


MAX_LINES = 500  # tests and migrations aside


def test_no_module_is_too_large_to_hold_in_ones_head() -> None:
    sizes = {path.relative_to(REPO).as_posix(): len(path.read_text().splitlines()) for _, path in _modules()}
    over = {rel: n for rel, n in sizes.items() if n > MAX_LINES and "/migrations/" not in rel}
    assert not over, over


# Module names two packages share, each one concept seen from two layers. Any other shared name is two concepts
# under one word: give one of them its own.
ONE_CONCEPT = {
    "errors": "the error tree (paperlane), and how the API answers with it (producer.api)",
    "ingests": "ingests' rows (storage), and the /v1/ingests routes (producer.api)",
    "usage": "usage counted (storage), and the /v1/usage route (producer.api)",
    "leases": "leases on jobs' rows (storage), and the worker's keeper of them (workers)",
    "outputs": "a document's outputs recorded (storage), and written (workers)",
    "webhooks": "the webhook outbox (storage), and its delivery (producer)",
}


def test_modules_share_a_name_only_when_they_hold_one_concept() -> None:
    packages: dict[str, set[str]] = {}
    for module, path in _modules():
        if path.stem not in ("__init__", "__main__"):
            packages.setdefault(path.stem, set()).add(module.rpartition(".")[0])
    shared = {name for name, where in packages.items() if len(where) > 1}
    assert shared == set(ONE_CONCEPT), {name: sorted(packages[name]) for name in shared ^ set(ONE_CONCEPT)}
