"""``paperlane tenants`` (fair-share weights and budgets) and ``paperlane usage`` (what each tenant used)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from paperlane.cli.root import app, command_settings, err, out
from paperlane.errors import UsageError
from paperlane.settings import Settings
from paperlane.status import JobStatus

tenants_app = typer.Typer(help="Tenants' fair-share weights and budgets.", no_args_is_help=True)
app.add_typer(tenants_app, name="tenants")


def _budget(value: str | None, what: str) -> dict[str, int | None]:
    """A budget option: a number of pages, or ``none`` to remove it; nothing given changes nothing."""
    if value is None:
        return {}
    if value.strip().lower() in ("none", "unlimited", "default"):
        return {what: None}
    if not value.strip().isdigit():
        raise UsageError(f"--{what.replace('_', '-')} takes a number of pages or 'none', got {value!r}")
    return {what: int(value)}


@tenants_app.command("set")
def tenants_set(
    tenant: Annotated[str, typer.Argument(help="the tenant's name")],
    monthly_pages: Annotated[str | None, typer.Option("--monthly-pages", help="pages a calendar month (UTC); past "
                                                      "it new uploads and ingests get 429; 'none': no budget")] = None,
    in_flight: Annotated[str | None, typer.Option("--in-flight", help="pages not final at once; 'none': the "
                                                  "setting api.max_pages_in_flight")] = None,
    weight: Annotated[float | None, typer.Option("--weight", help="its share of each lane beside other tenants "
                                                 "(default 1; 2: twice a tenant of weight 1)")] = None,
) -> None:
    """Set a tenant's fair-share weight and budgets; print them."""
    from paperlane.storage import tenants
    from paperlane.storage.db import Database

    settings = command_settings()
    changes: dict[str, Any] = {**_budget(monthly_pages, "monthly_pages"), **_budget(in_flight, "max_pages_in_flight")}
    if weight is not None:
        changes["weight"] = weight
    if not changes:
        raise UsageError("give --monthly-pages, --in-flight or --weight")
    db = Database(settings.database_url)
    db.upgrade()
    limits = tenants.set_limits(db, tenant, **changes)
    if weight is not None and settings.fair_share.enabled:
        _apply_weight(settings, limits.tenant_id, weight)
    _print_tenants([limits], settings)


def _apply_weight(settings: Settings, tenant_id: str, weight: float) -> None:
    """A new weight counts at once for the pages the tenant has waiting (new pages carry it anyway)."""
    from paperlane.priority.connection import open_redis
    from paperlane.priority.fair import FairLanes

    client = open_redis(settings.redis)
    try:
        FairLanes(client, buffer=settings.fair_share.buffer).set_weight(tenant_id, weight)
    except Exception as exc:  # noqa: BLE001 - the database has it; waiting pages keep their old weight
        err.print(f"weight saved; pages already waiting keep their old weight (Redis: {exc})", highlight=False)
    finally:
        client.close()


@tenants_app.command("list")
def tenants_list(tenant: Annotated[str | None, typer.Argument(help="one tenant's name")] = None) -> None:
    """Tenants with their fair-share weight and budgets."""
    from paperlane.storage import tenants
    from paperlane.storage.db import Database

    settings = command_settings()
    _print_tenants(tenants.limits(Database(settings.database_url), tenant), settings)


def _print_tenants(rows: list[Any], settings: Settings) -> None:
    table = Table("tenant", "weight", "monthly pages", "pages in flight")
    for r in rows:
        table.add_row(r.name, f"{r.weight:g}", "none" if r.monthly_pages is None else str(r.monthly_pages),
                      f"{settings.api.max_pages_in_flight} (setting)" if r.max_pages_in_flight is None
                      else str(r.max_pages_in_flight))
    out.print(table)


@app.command()
def usage(
    tenant: Annotated[str | None, typer.Option("--tenant", help="one tenant's name")] = None,
    since: Annotated[str | None, typer.Option("--since", help="first day, YYYY-MM-DD (UTC; default: this "
                                              "month's first)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """What each tenant used per day: pages by outcome, pages needing review, engine tokens and seconds."""
    from datetime import date

    from paperlane.storage import tenants
    from paperlane.storage import usage as metered
    from paperlane.storage.db import Database, utcnow

    db = Database(command_settings().database_url)
    try:
        start = date.fromisoformat(since) if since else metered.month_start(utcnow())
    except ValueError:
        raise UsageError(f"--since takes a date as YYYY-MM-DD, got {since!r}") from None
    tenant_id = None
    if tenant is not None:
        found = tenants.limits(db, tenant)
        if not found:
            raise UsageError(f"no tenant {tenant!r}")
        tenant_id = found[0].tenant_id
    rows = metered.days(db, since=start, tenant_id=tenant_id)
    if as_json:
        print(json.dumps({"since": start.isoformat(), "days": [r.as_dict() for r in rows],
                          "total": metered.totals(rows)}, indent=1))
        return
    table = Table("day", "tenant", "pages", JobStatus.SUCCEEDED.value, JobStatus.FAILED.value, "review",
                  "prompt tokens", "completion tokens", "engine s")
    for r in rows:
        table.add_row(r.day.isoformat(), r.tenant or "(command line)", *(str(v) for v in (
            r.pages, r.pages_succeeded, r.pages_failed, r.pages_review, r.prompt_tokens, r.completion_tokens)),
            f"{r.engine_seconds:.1f}")
    total = metered.totals(rows)
    table.add_row("total", "", *(str(total[k]) for k in ("pages", "pages_succeeded", "pages_failed", "pages_review",
                                                          "prompt_tokens", "completion_tokens")),
                  f"{total['engine_seconds']:.1f}", style="bold")
    out.print(table)
