"""paperlane installs as one package: its step folders import as ``paperlane.<step>``, layered bottom-up."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Lowest first. A module may import from its own package and from packages in lower layers only:
# settings, schemas and errors at the bottom, the CLI on top.
LAYERS: list[set[str]] = [
    {"paperlane.errors", "paperlane.schemas", "paperlane.settings", "paperlane.report", "paperlane.pdfium",
     "paperlane.metrics", "paperlane.status", "paperlane.filetypes", "paperlane.retry", "paperlane.layout"},
    {"paperlane.storage", "paperlane.models", "paperlane.formats"},
    {"paperlane.priority"},
    {"paperlane.producer"},
    {"paperlane.workers"},
    {"paperlane.cli", "paperlane.__main__"},
]
FOLDERS = {"paperlane": "paperlane", "producer": "paperlane.producer", "priority": "paperlane.priority",
           "workers": "paperlane.workers", "models": "paperlane.models", "storage": "paperlane.storage"}


def _unit(module: str) -> str:
    """The layered unit a module belongs to: a step package, or a core module of paperlane."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _layer(unit: str) -> int:
    for i, units in enumerate(LAYERS):
        if unit in units:
            return i
    raise AssertionError(f"{unit} is in no layer: add it to LAYERS")


def _modules() -> list[tuple[str, Path]]:
    found = []
    for folder, package in FOLDERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found.append((".".join([package, *parts]), path))
    return found


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "paperlane":  # ``from paperlane import filetypes``: the module paperlane.filetypes
                names.extend(f"paperlane.{alias.name}" for alias in node.names
                             if (REPO / "paperlane" / f"{alias.name}.py").exists()
                             or (REPO / "paperlane" / alias.name).is_dir())
            else:
                names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return names


def test_no_package_imports_one_above_it() -> None:
    wrong = []
    for module, path in _modules():
        own = _unit(module)
        for name in _imports(path):
            if name.split(".")[0] in FOLDERS and name.split(".")[0] != "paperlane":
                wrong.append(f"{module} imports top-level {name}")
                continue
            if not name.startswith("paperlane.") or _unit(name) == own:
                continue
            if _layer(_unit(name)) > _layer(own):
                wrong.append(f"{module} imports {name}, a layer above it")
    assert not wrong, "\n".join(wrong)


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
