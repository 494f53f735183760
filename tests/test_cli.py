"""The command line's layout: what ``paperlane.cli``'s docstring lists is what ``paperlane`` runs, and where."""

from __future__ import annotations

import re
from typing import Any

import typer

import paperlane.cli
from paperlane.cli import app


def _commands(cmd: Any, prefix: str = "") -> dict[str, str]:
    """Every command ``paperlane`` runs (a group's as ``group sub``), and the module of its function."""
    found: dict[str, str] = {}
    for name, sub in cmd.commands.items():
        if isinstance(getattr(sub, "commands", None), dict):  # typer vendors its own click: a group has commands
            found.update(_commands(sub, f"{prefix}{name} "))
        else:
            found[f"{prefix}{name}"] = sub.callback.__module__
    return found


def _listed() -> dict[str, str]:
    """The commands the package's docstring lists, each with the module it names for it."""
    listed: dict[str, str] = {}
    for line in (paperlane.cli.__doc__ or "").splitlines():
        item = re.fullmatch(r"- (.+) \(``(\w+)``\):.*", line.strip())
        if item is None:
            continue
        for spelled in re.findall(r"``([^`]+)``", item.group(1)):
            group, _, subs = spelled.rpartition(" ")
            for sub in subs.split("|"):
                listed[f"{group} {sub}".strip()] = f"paperlane.cli.{item.group(2)}"
    return listed


def test_the_package_docstring_lists_every_command_and_where_it_lives() -> None:
    assert _listed() == _commands(typer.main.get_command(app))
