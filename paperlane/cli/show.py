"""What is there to see: ``paperlane status`` (jobs, pages, documents, ingests), ``review`` and ``report``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from paperlane.cli.root import app, command_settings, err, out, print_time_table, printable
from paperlane.errors import UsageError
from paperlane.settings import Settings
from paperlane.status import PageState, RollupState

if TYPE_CHECKING:
    from paperlane.storage.objects import ObjectStore
    from paperlane.storage.tables import JobRow


@app.command()
def status(
    job_ids: Annotated[list[str] | None, typer.Argument(help="job ids printed by submit")] = None,
    ingest: Annotated[str | None, typer.Option("--ingest", help="an ingest's progress")] = None,
    document: Annotated[str | None, typer.Option("--document", help="a document's progress")] = None,
    page: Annotated[str | None, typer.Option("--page", help="a page (id from submit --json)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Status: of jobs (their attempts, error, stage timings, results), or the progress of an ingest or a
    document (pages queued / running / succeeded / failed, pages/s, time left, failures by reason; an ingest's
    share of the engine now and the time it needs at that share)."""
    from paperlane.storage import jobs as jobstore
    from paperlane.storage import status_reads, views
    from paperlane.storage.db import Database
    from paperlane.storage.objects import open_store

    settings = command_settings()
    db = Database(settings.database_url)
    if ingest or document:
        view = (_ingest_view(settings, db, ingest) if ingest
                else views.document_view(*status_reads.document_progress(db, document or "")))
        if as_json:
            print(json.dumps(view, indent=1))
        else:
            _print_progress(view)
        raise typer.Exit(1 if view[PageState.FAILED.value] else 0)
    if page:
        found = status_reads.get_page(db, page)
        job_ids = [found.job.id]
    if not job_ids:
        raise UsageError("give job ids, --page, --document or --ingest")
    store = open_store(settings)
    rows = {r.id: r for r in jobstore.get_jobs(db, job_ids)}
    shown = [_job_view(rows.get(j), j, store) for j in job_ids]
    if as_json:
        print(json.dumps(shown if len(shown) > 1 else shown[0], indent=1))
    else:
        for v in shown:
            _print_job(v)
    raise typer.Exit(1 if any(v["status"] in (None, PageState.FAILED.value) for v in shown) else 0)


def _ingest_view(settings: Settings, db: Any, ingest_id: str) -> dict[str, Any]:
    """The ingest's view, with its share of the engine read from Redis while its pages are not all final."""
    from paperlane.priority.connection import open_redis
    from paperlane.priority.fair import FairLanes
    from paperlane.storage import status_reads, views

    row, progress, failures = status_reads.ingest_progress(db, ingest_id)
    share = None
    if not progress.done and settings.fair_share.enabled:
        client = open_redis(settings.redis)
        try:
            share = FairLanes(client, buffer=settings.fair_share.buffer).share_or_none(row.lane, row.tenant_id, row.id)
        finally:
            client.close()
    return views.ingest_view(row, progress, failures, share=share)


def _print_progress(v: dict[str, Any]) -> None:
    kind = "ingest" if "ingest_id" in v and "documents" in v else "document"
    state = RollupState(v["status"])
    out.print(f"[bold]{kind} {v[f'{kind}_id']}[/]  {printable(v['name'])}  [{_colour(state)}]{state.value}[/]",
              highlight=False)
    final = v[PageState.SUCCEEDED.value] + v[PageState.FAILED.value]
    extra = f", {v['documents']} documents, {v['skipped']} files skipped" if kind == "ingest" else ""
    out.print(f"  {final}/{v['pages']} pages final{extra}")
    out.print("  " + "  ".join(f"{s.value} {v[s.value]}" for s in PageState if s is not PageState.UNPUBLISHED)
              + (f"  [red]{PageState.UNPUBLISHED.value} {v[PageState.UNPUBLISHED.value]} (broker was unreachable; "
                 "submit again)[/]" if v[PageState.UNPUBLISHED.value] else ""))
    if v.get("needs_review"):
        hint = f" (paperlane review --ingest {v['ingest_id']})" if kind == "ingest" else ""
        out.print(f"  [yellow]needs review {v['needs_review']}[/]{hint}", highlight=False)
    if v.get("outputs") and v["outputs"]["state"]:
        failed = f" ({printable(v['outputs']['error'])})" if v["outputs"]["error"] else ""
        formats = f": {', '.join(v['outputs']['formats'])}" if v["outputs"].get("formats") else ""
        out.print(f"  outputs {v['outputs']['state']}{formats}{failed}", highlight=False)
    if v.get("pages_per_s"):
        eta = f", about {_duration(v['eta_s'])} left" if v["eta_s"] and not state.final else ""
        out.print(f"  {v['pages_per_s']:.1f} pages/s{eta}")
    if v.get("share") is not None:
        left = f", about {_duration(v['share_eta_s'])} left at that share" if v.get("share_eta_s") else ""
        out.print(f"  {v['share'] * 100:.1f}% of the engine now{left}")
    for f in v["failures"]:
        out.print(f"  [red]{f['pages']:>6}[/] {printable(f['reason'])}", highlight=False)


def _colour(state: RollupState | PageState | None) -> str:
    if state is None:
        return "white"
    return {RollupState.SUCCEEDED.value: "green", RollupState.FAILED.value: "red",
            RollupState.PARTIAL.value: "yellow", RollupState.RUNNING.value: "yellow"}.get(state.value, "white")


def _duration(seconds: float) -> str:
    minutes, sec = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{sec:02d}s" if minutes else f"{sec}s"


def _job_view(row: JobRow | None, job_id: str, store: ObjectStore) -> dict[str, Any]:
    from paperlane.storage.jobs import job_timings
    from paperlane.storage.views import job_view

    if row is None:
        return {"job_id": job_id, "status": None, "error": "no such job"}
    return job_view(row, job_timings(row), result_url=store.url(row.result_key) if row.result_key else None,
                    annotated_url=store.url(row.annotated_key) if row.annotated_key else None)


def _print_job(v: dict[str, Any]) -> None:
    state = PageState(v["status"]) if v["status"] else None
    out.print(f"[bold]{v['job_id']}[/]  [{_colour(state)}]{v['status'] or 'unknown'}[/]", highlight=False)
    if v["status"] is None:
        out.print("  no such job")
        return
    out.print(f"  {printable(v['source'])} page {v['page']}  lane={v['lane']} task={v['task']} "
              f"attempts={v['attempts']}", highlight=False)
    if v["worker"]:
        out.print(f"  held by {printable(v['worker'])} (lease until {v['lease_until']})", highlight=False)
    if v["error"]:
        out.print(f"  error ({v['error_stage'] or '?'}): {printable(v['error'])}", highlight=False)
    if v["timings"]:
        out.print("  " + "  ".join(f"{k}={s * 1000:.0f}ms" for k, s in v["timings"].items()))
    for key in ("result", "annotated"):
        if v[key]:
            out.print(f"  {key}: {printable(v[key])}", highlight=False)


@app.command()
def review(
    ingest: Annotated[str, typer.Option("--ingest", help="an ingest's id")],
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    limit: Annotated[int, typer.Option("--limit", min=1, help="at most this many pages")] = 1000,
) -> None:
    """Pages of an ingest whose results need a person's eyes (a loop stopped, a fallback engine, truncated, empty,
    low confidence), with why and their confidence, by document and page."""
    from paperlane.storage import status_reads, views
    from paperlane.storage.db import Database

    db = Database(command_settings().database_url)
    shown = [views.review_view(p) for p in status_reads.review_pages(db, ingest, limit=limit)]
    if as_json:
        print(json.dumps(shown, indent=1))
        return
    table = Table("source", "page", "flags", "confidence", "engine")
    for v in shown:
        confidence = f"{v['confidence']:.2f}" if v["confidence"] is not None else ""
        table.add_row(printable(v["source"]), str(v["page_no"]), ", ".join(v["flags"]), confidence,
                      printable(v["engine"] or ""))
    out.print(table)
    err.print(f"{len(shown)} page{'s' * (len(shown) != 1)} need review", highlight=False)


@app.command()
def report(
    last: Annotated[int, typer.Option("--last", help="the most recent N finished pages")] = 1000,
) -> None:
    """Where the time goes: per-stage p50, p95 and share over recently finished pages."""
    from paperlane.storage.db import Database
    from paperlane.storage.jobs import recent_timings

    settings = command_settings()
    timings = recent_timings(Database(settings.database_url), last=last)
    out.print(f"{len(timings)} finished pages")
    print_time_table(timings)
