"""``paperlane keys``: tenants' API keys, webhook signing secrets and the S3 prefixes they may ingest."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from paperlane.cli.root import app, command_settings, err, out, printable
from paperlane.errors import UsageError

keys_app = typer.Typer(help="API keys of tenants (the HTTP API).", no_args_is_help=True)
app.add_typer(keys_app, name="keys")


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option("--tenant", help="the tenant's name (made if new)")],
    interactive: Annotated[bool, typer.Option("--interactive", help="may use the interactive lane")] = False,
) -> None:
    """Make an API key. It is printed once, on stdout; only its hash is kept."""
    from paperlane.storage import tenants
    from paperlane.storage.db import Database

    settings = command_settings()
    db = Database(settings.database_url)
    db.upgrade()
    made = tenants.create_key(db, tenant=tenant, interactive=interactive)
    if made.tenant_created:
        err.print(f"tenant {printable(tenant)} created ({made.tenant_id}); its webhook signing secret: "
                  f"{made.webhook_secret}",
                  highlight=False, soft_wrap=True)
    lanes = "interactive and batch lanes" if interactive else "batch lane only"
    err.print(f"key {made.key[:10]}... for {printable(tenant)} ({lanes}); store it now, it is not shown again:",
              highlight=False)
    print(made.key)


@keys_app.command("list")
def keys_list(tenant: Annotated[str | None, typer.Option("--tenant")] = None) -> None:
    """API keys (their first characters), tenants, lanes, and whether revoked."""
    from paperlane.storage import tenants
    from paperlane.storage.db import Database

    db = Database(command_settings().database_url)
    table = Table("key", "tenant", "lanes", "created", "revoked")
    for key, name in tenants.list_keys(db, tenant):
        table.add_row(f"{key.prefix}...", printable(name), "interactive, batch" if key.interactive else "batch",
                      key.created_at.strftime("%Y-%m-%d %H:%M"),
                      key.revoked_at.strftime("%Y-%m-%d %H:%M") if key.revoked_at else "")
    out.print(table)


@keys_app.command("revoke")
def keys_revoke(prefix: Annotated[str, typer.Argument(help="the key, or its first 8-10 characters")]) -> None:
    """Revoke a key (API replicas stop accepting it within seconds). A prefix is matched literally."""
    from paperlane.storage import tenants
    from paperlane.storage.db import Database

    n = tenants.revoke_key(Database(command_settings().database_url), prefix)
    err.print(f"{n} key{'s' if n != 1 else ''} revoked", highlight=False)
    raise typer.Exit(0 if n else 1)


@keys_app.command("rotate-secret")
def keys_rotate_secret(tenant: Annotated[str, typer.Option("--tenant", help="the tenant's name")]) -> None:
    """Give a tenant a new webhook signing secret, printed once on stdout: every webhook from now on is signed
    with it (the old one stops at once)."""
    from paperlane.storage import tenants
    from paperlane.storage.db import Database

    db = Database(command_settings().database_url)
    db.upgrade()
    secret = tenants.rotate_webhook_secret(db, tenant)
    err.print(f"tenant {printable(tenant)}: new webhook signing secret (not shown again):", highlight=False)
    print(secret)


S3Opt = Annotated[str, typer.Argument(help="s3://BUCKET/PREFIX (a folder; s3://BUCKET/ for the whole bucket)")]


@keys_app.command("grant")
def keys_grant(tenant: Annotated[str, typer.Option("--tenant", help="the tenant's name")], source: S3Opt) -> None:
    """Let a tenant ingest (POST /v1/ingests) the objects under an S3 prefix, read with paperlane's own S3
    credentials. paperlane's own bucket cannot be granted."""
    from paperlane.storage import tenants
    from paperlane.storage.db import Database

    settings = command_settings()
    bucket, prefix = _s3_prefix(source)
    if bucket == settings.storage.bucket:
        raise UsageError(f"s3://{bucket} is paperlane's own bucket (storage.bucket): it is never ingestible")
    db = Database(settings.database_url)
    db.upgrade()
    stored = tenants.grant_ingest(db, tenant, bucket, prefix)
    err.print(f"tenant {printable(tenant)} may ingest s3://{printable(bucket)}/{printable(stored)}", highlight=False)


@keys_app.command("ungrant")
def keys_ungrant(tenant: Annotated[str, typer.Option("--tenant", help="the tenant's name")], source: S3Opt) -> None:
    """Withdraw a grant made with ``keys grant`` (ingests already registered go on)."""
    from paperlane.storage import tenants
    from paperlane.storage.db import Database

    bucket, prefix = _s3_prefix(source)
    n = tenants.revoke_grant(Database(command_settings().database_url), tenant, bucket, prefix)
    err.print(f"{n} grant{'s' if n != 1 else ''} withdrawn", highlight=False)
    raise typer.Exit(0 if n else 1)


@keys_app.command("grants")
def keys_grants(tenant: Annotated[str | None, typer.Option("--tenant")] = None) -> None:
    """The S3 prefixes each tenant may ingest."""
    from paperlane.storage import tenants
    from paperlane.storage.db import Database

    table = Table("tenant", "may ingest")
    for name, bucket, prefix in tenants.list_grants(Database(command_settings().database_url), tenant):
        table.add_row(printable(name), printable(f"s3://{bucket}/{prefix}"))
    out.print(table)


def _s3_prefix(source: str) -> tuple[str, str]:
    if not source.startswith("s3://") or not source[5:].partition("/")[0]:
        raise UsageError(f"give s3://BUCKET/PREFIX, not {source}")
    bucket, _, prefix = source[5:].partition("/")
    if any(part in (".", "..") for part in prefix.split("/")):
        raise UsageError("a prefix may not hold . or .. as a path segment")
    return bucket, prefix
