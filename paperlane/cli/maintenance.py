"""Maintenance: ``paperlane db upgrade``, ``paperlane db retention`` and ``paperlane dead-letters``."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from paperlane.cli.root import app, command_settings, db_app, err, out, printable


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the database schema to the newest version."""
    from paperlane.storage.db import Database

    settings = command_settings()
    Database(settings.database_url).upgrade()
    err.print(f"database at newest schema: {settings.database_url.split('@')[-1]}")


@db_app.command("retention")
def db_retention(
    keep_days: Annotated[int | None, typer.Option(help="default: database.retention_days")] = None,
) -> None:
    """PostgreSQL: make the partitions ahead; drop old months of history (storage.history). Run it daily."""
    from paperlane.storage import history
    from paperlane.storage.db import Database

    settings = command_settings()
    done = history.retain(Database(settings.database_url), keep_days=keep_days or settings.database.retention_days,
                          ahead=settings.database.partitions_ahead)
    for line in done.lines() or ["nothing to do"]:
        out.print(line)


@app.command("dead-letters")
def dead_letters(
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    purge: Annotated[bool, typer.Option("--purge", help="empty the list (what it held is shown)")] = False,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="only the newest N")] = None,
) -> None:
    """Messages workers set aside instead of taking them off a lane (not JSON, not a page message, no such
    job): newest first, with why, the queue and when."""
    from dataclasses import asdict

    from paperlane.priority.connection import open_redis
    from paperlane.priority.deadletter import DeadLetters

    client = open_redis(command_settings().redis)
    try:
        letters = DeadLetters(client)
        found = letters.purge() if purge else letters.recent(limit)
    finally:
        client.close()
    if as_json:
        print(json.dumps([asdict(d) for d in found], indent=1, ensure_ascii=False))
        return
    for d in found:
        out.print(f"{d.at}  {d.queue or '?'}  [red]{printable(d.reason)}[/]", highlight=False)
        message = d.message if len(d.message) <= 300 else d.message[:297] + "..."
        out.print(f"  {'base64 ' if d.encoding == 'base64' else ''}{printable(message)}", highlight=False)
    err.print(f"{len(found)} dead letters{' purged' if purge else ''}", highlight=False)
