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
