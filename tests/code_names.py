"""What a deployment file may name, checked against paperlane's code: settings (``PAPERLANE_*`` variables),
``paperlane`` subcommands and their options, and command-line flags. Shared by tests/test_compose.py (docker
compose) and tests/test_deploy.py (Kubernetes)."""

from __future__ import annotations

from typing import Any

import typer
from pydantic import BaseModel

from paperlane.cli import app
from paperlane.settings import Settings


def unknown_setting(var: str) -> str | None:
    """Why ``var`` is not one of paperlane's settings, or None when it is one."""
    model: type[BaseModel] = Settings
    parts = var.upper().removeprefix("PAPERLANE_").lower().split("__")
    for i, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return f"{var}: {model.__name__} has no setting {part!r}"
        ann = field.annotation
        is_section = isinstance(ann, type) and issubclass(ann, BaseModel)
        if i < len(parts) - 1:
            if not is_section:
                return f"{var}: {part!r} is a setting, not a section"
            model = ann  # type: ignore[assignment]
        elif is_section:
            return f"{var}: {part!r} is a section, not a setting"
    return None


def flags(args: list[str]) -> dict[str, str]:
    """``--name=value``, ``--name value`` and bare ``--name`` (value "") of a command line."""
    out: dict[str, str] = {}
    for i, arg in enumerate(args):
        if arg.startswith("-"):
            name, eq, value = arg.partition("=")
            if not eq and i + 1 < len(args) and not args[i + 1].startswith("-"):
                value = args[i + 1]
            out[name] = value
    return out


def is_group(cmd: Any) -> bool:
    return isinstance(getattr(cmd, "commands", None), dict)


def command(args: list[str]) -> tuple[Any, list[str]]:
    """The click command ``paperlane ARGS`` runs, and the arguments left for it.

    typer 0.29 vendors its own click, so groups are told apart by their ``commands``, not their class.
    """
    cmd: Any = typer.main.get_command(app)
    rest = list(args)
    while is_group(cmd) and rest and rest[0] in cmd.commands:
        cmd = cmd.commands[rest.pop(0)]
    return cmd, rest


def command_problem(args: list[str]) -> str | None:
    """Why ``paperlane ARGS`` is not a registered command with options it has, or None when it is."""
    cmd, rest = command(args)
    if is_group(cmd):
        return f"paperlane {' '.join(args)}: no such command"
    known = {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)}
    unknown = [a.partition("=")[0] for a in rest if a.startswith("-") and a.partition("=")[0] not in known]
    return f"paperlane {' '.join(args)}: options it does not have: {unknown}" if unknown else None
