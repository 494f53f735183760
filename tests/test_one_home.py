"""Policies with one home: only ``priority.keys`` names Redis keys, only ``priority.connection`` opens a Redis
client, only ``paperlane.status`` spells a state, only ``paperlane.filetypes`` reads magic bytes, only
``paperlane.errors.first_error`` words what pydantic found wrong."""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from paperlane.priority import keys
from paperlane.status import JobStatus, OutputsState, PageState, RollupState

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("paperlane", "producer", "priority", "workers", "models", "storage")
# Migrations are history: they keep the words they were written with, and import none of today's
# (test_a_migration_imports_nothing_that_changes_with_the_code).
MIGRATIONS = "storage/migrations/versions"
FROZEN = {f"{MIGRATIONS}/"}


def _sources(*, skip: set[str]) -> list[tuple[str, ast.AST]]:
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel in skip or any(rel.startswith(prefix) for prefix in FROZEN):
                continue
            found.append((rel, ast.parse(path.read_text(), rel)))
    return found


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string constant, f-strings' literal parts included, but docstrings left out."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_only_the_keys_module_names_redis_keys() -> None:
    names = (keys.DELAYED, keys.RELEASING, keys.DELAYED_CHANNEL, keys.DEAD_LETTERS, keys.UNACKED, keys.answer("x"),
             keys.rate("x"), keys.streams("x"), keys.queue("x"))
    assert all(_key_like(name) for name in names)  # what the check below looks for is what keys are like
    wrong = [f"{rel}:{line}: {text!r}" for rel, tree in _sources(skip={"priority/keys.py"})
             for line, text in _strings(tree) if _key_like(text)]
    assert not wrong, "Redis key names outside priority/keys.py:\n" + "\n".join(wrong)


def _key_like(text: str) -> bool:
    """``paperlane.<what>...`` or ``paperlane:<what>...`` with no space, or kombu's ``unacked``, that is not a
    module, task, signal uid or file of paperlane's."""
    if text == keys.UNACKED:
        return True
    if not re.fullmatch(r"paperlane[.:][\w.:-]+", text):
        return False
    first = re.split(r"[.:]", text)[1]
    return first not in {*PACKAGES, "process_page", "pdfium", "cli", "errors", "schemas", "settings", "status",
                         "formats", "retry", "metrics", "report", "lane_gate", "stop", "db"}


def test_only_the_connection_module_opens_a_redis_client() -> None:
    wrong = []
    for rel, tree in _sources(skip={"priority/connection.py"}):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                    node.func.attr in ("from_url", "StrictRedis", "ConnectionPool")
                    or (node.func.attr == "Redis" and isinstance(node.func.value, ast.Name)
                        and node.func.value.id == "redis")):
                wrong.append(f"{rel}:{node.lineno}")
    assert not wrong, "Redis clients opened outside priority/connection.py:\n" + "\n".join(wrong)


def test_every_state_word_comes_from_the_status_module() -> None:
    words = {s.value for enum in (JobStatus, PageState, RollupState, OutputsState) for s in enum}
    wrong = [f"{rel}:{line}: {text!r}" for rel, tree in _sources(skip={"paperlane/status.py"})
             for line, text in _strings(tree) if text in words]
    assert not wrong, "state words spelled outside paperlane/status.py:\n" + "\n".join(wrong)


def test_only_the_formats_module_reads_magic_bytes() -> None:
    magic = (b"%PDF", b"\xff\xd8\xff", b"\x89PNG", b"II*\x00", b"MM\x00*", b"PK\x03\x04", b"GIF8", b"\x1f\x8b", b"BZh",
             b"\xfd7zXZ")
    wrong = [f"{rel}:{node.lineno}" for rel, tree in _sources(skip={"paperlane/filetypes.py"})
             for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, bytes)
             and any(node.value.startswith(m) for m in magic)]
    assert not wrong, "magic bytes outside paperlane/filetypes.py:\n" + "\n".join(wrong)


def test_only_the_errors_module_words_a_validation_error() -> None:
    """``first_error`` reads pydantic's ``exc.errors()[0]``; a second reader is a second wording."""
    wrong = [f"{rel}:{node.lineno}" for rel, tree in _sources(skip={"paperlane/errors.py"})
             for node in ast.walk(tree)
             if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Call)
             and isinstance(node.value.func, (ast.Attribute, ast.Name))
             and getattr(node.value.func, "attr", getattr(node.value.func, "id", None)) == "errors"]
    assert not wrong, "validation errors worded outside paperlane/errors.py:\n" + "\n".join(wrong)


def test_only_the_schemas_module_bounds_a_weight() -> None:
    wrong = [f"{rel}:{node.lineno}" for rel, tree in _sources(skip={"paperlane/schemas.py"})
             for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id in ("MIN_WEIGHT", "MAX_WEIGHT")]
    assert not wrong, "weight bounds read outside paperlane/schemas.py:\n" + "\n".join(wrong)


@pytest.mark.parametrize("weight", [0.0, 0.0009, 0.001, 1.0, 1000.0, 1000.5, math.inf, math.nan, -1.0])
def test_every_edge_takes_the_same_weights(weight: float) -> None:
    """The API's options, a page message's share and the command line's checks agree on what a weight is."""
    from paperlane.errors import UsageError
    from paperlane.priority.fair import HEADER
    from paperlane.priority.messages import BadMessage, page_share
    from paperlane.producer.api.options import Options
    from paperlane.schemas import MAX_WEIGHT, MIN_WEIGHT, check_weight

    def taken(check: Callable[[], object], refused: type[Exception]) -> bool:
        try:
            check()
        except refused:
            return False
        return True

    expected = math.isfinite(weight) and MIN_WEIGHT <= weight <= MAX_WEIGHT
    assert taken(lambda: Options.model_validate({"weight": weight}), ValidationError) is expected
    assert taken(lambda: page_share({HEADER: {"tenant": "t", "ingest": "i", "ingest_weight": weight}}),
                 BadMessage) is expected
    assert taken(lambda: check_weight(weight), UsageError) is expected


def test_a_migration_imports_nothing_that_changes_with_the_code() -> None:
    """A migration's SQL is fixed when it is written: it may build on an earlier migration, never on live code."""
    wrong = []
    for path in sorted((REPO / MIGRATIONS).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            wrong += [f"{path.name}:{node.lineno} {name}" for name in names
                      if name.split(".")[0] in PACKAGES and not name.startswith("paperlane.storage.migrations")]
    assert not wrong, "migrations importing live code:\n" + "\n".join(wrong)


def test_the_worker_and_the_api_each_open_one_redis_client_for_their_parts() -> None:
    """What ``priority/connection.py`` says: a worker and an API process open one client each (the CLI's commands
    one each); their parts take it (no part may open one: the test above)."""
    calls: dict[str, int] = {}
    for rel, tree in _sources(skip=set()):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "open_redis":
                calls[rel] = calls.get(rel, 0) + 1
    assert {rel: n for rel, n in calls.items() if not rel.startswith("paperlane/cli/")} == {
        "workers/worker.py": 1, "producer/api/service.py": 1}
