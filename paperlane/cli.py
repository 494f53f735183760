"""The ``paperlane`` command line: run, submit, worker, status, report, db."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from paperlane.errors import PaperlaneError, UsageError
from paperlane.priority.lanes import Lane
from paperlane.schemas import JobStatus, PageResult, Task, TaskSpec
from paperlane.settings import EngineKind, EngineSettings, Settings, load_settings

if TYPE_CHECKING:
    from paperlane.storage.objects import ObjectStore
    from paperlane.storage.tables import JobRow

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="paperlane: scanned documents to structured text, from one page to millions.")
db_app = typer.Typer(help="Database maintenance.", no_args_is_help=True)
app.add_typer(db_app, name="db")

out = Console()
err = Console(stderr=True)


class _State:
    config: Path | None = None
    log_level: int = logging.WARNING


_state = _State()

EngineOpt = Annotated[EngineKind | None, typer.Option("--engine", help="OCR engine (default: settings, rapid)")]
EngineUrlOpt = Annotated[str | None, typer.Option("--engine-url", help="vllm: http://HOST:PORT/v1")]
ModelOpt = Annotated[str | None, typer.Option("--model", help="served model name or local model folder")]
ProfileOpt = Annotated[str | None, typer.Option("--profile", help="model profile, e.g. hunyuanocr-1.0")]
TaskOpt = Annotated[Task, typer.Option("--task", help="what to extract from each page")]
FieldOpt = Annotated[list[str] | None, typer.Option("--field", help="fields task: a key to extract (repeat)")]
LangOpt = Annotated[str, typer.Option("--to", help="translate task: target language")]
LaneOpt = Annotated[Lane, typer.Option("--lane", help="interactive pages overtake the batch backlog")]
ForceOpt = Annotated[bool, typer.Option("--force", help="redo pages already done")]


@app.callback()
def _main(
    config: Annotated[Path | None, typer.Option("--config", help="a KEY=VALUE file of PAPERLANE_* settings")] = None,
    verbose: Annotated[int, typer.Option("--verbose", "-v", count=True, help="-v: log at INFO, -vv: DEBUG")] = 0,
) -> None:
    _state.config = config
    _state.log_level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    _configure_logging(_state.log_level)


def _configure_logging(level: int) -> None:
    logging.basicConfig(level=level, stream=sys.stderr, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("botocore", "boto3", "urllib3", "RapidOCR", "alembic", "httpx", "kombu", "celery.redirected"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))


def _settings(engine: EngineKind | None = None, engine_url: str | None = None, model: str | None = None,
              profile: str | None = None) -> Settings:
    try:
        settings = load_settings(_state.config)
        overrides = {k: v for k, v in
                     {"kind": engine, "url": engine_url, "model": model, "profile": profile}.items() if v is not None}
        if overrides:
            merged = EngineSettings.model_validate({**settings.engine.model_dump(), **overrides})
            settings = settings.model_copy(update={"engine": merged})
        return settings
    except ValueError as exc:
        raise UsageError(_first_error(exc)) from exc


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}".strip(": ")
    return str(exc)


def _spec(task: Task, fields: list[str] | None, to: str) -> TaskSpec:
    try:
        return TaskSpec(task=task, fields=tuple(fields or ()), target_language=to)
    except ValueError as exc:
        raise UsageError(_first_error(exc)) from exc


@app.command()
def run(
    paths: Annotated[list[Path], typer.Argument(help="images, PDFs, TIFFs, folders, zip/tar archives")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="where <name>.json and <name>.annotated.jpg go")],
    task: TaskOpt = Task.SPOTTING, field: FieldOpt = None, to: LangOpt = "English",
    lane: LaneOpt = Lane.BATCH, force: ForceOpt = False,
    engine: EngineOpt = None, engine_url: EngineUrlOpt = None, model: ModelOpt = None, profile: ProfileOpt = None,
) -> None:
    """Process pages in this process (no Redis needed) and write one JSON and one PNG per page."""
    from paperlane.producer.inputs import expand
    from paperlane.workers.embedded import run_embedded
    from paperlane.workers.pipeline import Runtime

    settings = _settings(engine, engine_url, model, profile)
    spec = _spec(task, field, to)
    pages = expand(paths)
    rt = Runtime.start(settings)
    try:
        summary = run_embedded(rt, pages, out_dir=out_dir, spec=spec, lane=lane, force=force, on_page=_print_page)
    finally:
        rt.close()
    ok = summary.pages - summary.failed
    out.print(f"\n{summary.pages} pages: {ok} succeeded, {summary.failed} failed "
              f"in {summary.seconds:.1f}s -> {out_dir}")
    _print_time_table(summary.timings)
    raise typer.Exit(1 if summary.failed else 0)


def _print_page(name: str, result: PageResult) -> None:
    total = sum(v for k, v in result.timings.items() if k not in ("upload", "queue_wait"))
    if result.status is JobStatus.SUCCEEDED:
        flag = " (truncated)" if result.truncated else ""
        out.print(f"[green]ok[/]     {name}  {len(result.lines)} lines, {len(result.text)} chars, {total:.2f}s{flag}")
    else:
        out.print(f"[red]failed[/] {name}  {result.error}", highlight=False)


def _print_time_table(timings: list[dict[str, float]]) -> None:
    from paperlane.report import stage_report

    rows = stage_report(timings)
    if not rows:
        return
    table = Table(title="where the time went", title_justify="left")
    for col in ("stage", "pages", "p50 ms", "p95 ms", "share"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for r in rows:
        table.add_row(r.stage, str(r.pages), f"{r.p50 * 1000:.1f}", f"{r.p95 * 1000:.1f}", f"{r.share:.1%}")
    out.print(table)


@app.command()
def submit(
    paths: Annotated[list[Path], typer.Argument(help="images, PDFs, TIFFs, folders, zip/tar archives")],
    task: TaskOpt = Task.SPOTTING, field: FieldOpt = None, to: LangOpt = "English",
    lane: LaneOpt = Lane.BATCH,
    priority: Annotated[int, typer.Option("--priority", help="order within the lane, 0 (first) to 4")] = 0,
    force: ForceOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per page instead of bare ids")] = False,
) -> None:
    """Upload pages, register one job per page, queue them; print one job id per line."""
    from paperlane.priority.broker import make_celery
    from paperlane.producer.inputs import expand
    from paperlane.producer.submit import CeleryPublisher, submit_pages
    from paperlane.storage.db import Database
    from paperlane.storage.objects import open_store

    settings = _settings()
    spec = _spec(task, field, to)
    db = Database(settings.database_url)
    db.upgrade()
    publisher = CeleryPublisher(make_celery(settings))
    counts: dict[str, int] = {}
    for sub in submit_pages(expand(paths), db=db, store=open_store(settings), spec=spec, lane=lane,
                            level=priority, force=force, publisher=publisher):
        counts[sub.action] = counts.get(sub.action, 0) + 1
        if as_json:
            print(json.dumps({"job_id": sub.job.id, "action": sub.action, "source": sub.page.source,
                              "page": sub.page.page, "status": sub.job.status}), flush=True)
        else:
            print(sub.job.id, flush=True)
    err.print(", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "nothing to submit")


@app.command()
def worker(
    engine: EngineOpt = None, engine_url: EngineUrlOpt = None, model: ModelOpt = None, profile: ProfileOpt = None,
    queues: Annotated[str | None, typer.Option("--queues", "-Q", help="comma-separated lane names")] = None,
    hostname: Annotated[str | None, typer.Option("--hostname", "-n")] = None,
) -> None:
    """Run a Celery worker that keeps one OCR engine resident and processes queued pages."""
    from paperlane.priority.broker import make_celery
    from paperlane.workers.pipeline import Runtime
    from paperlane.workers.tasks import register_tasks

    settings = _settings(engine, engine_url, model, profile)
    _configure_logging(min(_state.log_level, logging.INFO))  # a worker's log is its output
    lanes = [Lane(q.strip()) for q in queues.split(",")] if queues else list(Lane)
    rt = Runtime.start(settings)
    app_ = make_celery(settings)
    parts = register_tasks(app_, rt, lanes=lanes)
    argv = ["worker", "--pool=threads", f"--concurrency={rt.slots}", "--without-gossip",
            "--without-mingle",
            f"--queues={','.join(lane.queue for lane in lanes)}", f"--loglevel={settings.log_level}"]
    if hostname:
        argv.append(f"--hostname={hostname}")
    try:
        app_.worker_main(argv)
    finally:
        parts.close()
        rt.close()


@app.command()
def status(
    job_ids: Annotated[list[str], typer.Argument(help="job ids printed by submit")],
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Show jobs' status, attempts, error, stage timings and where their results are."""
    from paperlane.storage import jobs as jobstore
    from paperlane.storage.db import Database
    from paperlane.storage.objects import open_store

    settings = _settings()
    db = Database(settings.database_url)
    db.upgrade()
    store = open_store(settings)
    rows = {r.id: r for r in jobstore.get_jobs(db, job_ids)}
    views = [_job_view(rows.get(j), j, store) for j in job_ids]
    if as_json:
        print(json.dumps(views if len(views) > 1 else views[0], indent=1))
    else:
        for v in views:
            _print_job(v)
    raise typer.Exit(1 if any(v["status"] in (None, "failed") for v in views) else 0)


def _job_view(row: JobRow | None, job_id: str, store: ObjectStore) -> dict[str, Any]:
    from paperlane.storage.jobs import job_timings

    if row is None:
        return {"job_id": job_id, "status": None, "error": "no such job"}
    return {
        "job_id": row.id, "status": row.status, "lane": row.lane, "task": row.task, "source": row.source,
        "page": row.page, "attempts": row.attempts, "error": row.error, "error_stage": row.error_stage,
        "engine": row.engine, "timings": job_timings(row),
        "result": store.url(row.result_key) if row.result_key else None,
        "annotated": store.url(row.annotated_key) if row.annotated_key else None,
        "created_at": row.created_at.isoformat() if row.created_at else None,
        "finished_at": row.finished_at.isoformat() if row.finished_at else None,
    }


def _print_job(v: dict[str, Any]) -> None:
    colour = {"succeeded": "green", "failed": "red", "running": "yellow"}.get(v["status"] or "", "white")
    out.print(f"[bold]{v['job_id']}[/]  [{colour}]{v['status'] or 'unknown'}[/]", highlight=False)
    if v["status"] is None:
        out.print("  no such job")
        return
    out.print(f"  {v['source']} page {v['page']}  lane={v['lane']} task={v['task']} attempts={v['attempts']}",
              highlight=False)
    if v["error"]:
        out.print(f"  error ({v['error_stage'] or '?'}): {v['error']}", highlight=False)
    if v["timings"]:
        out.print("  " + "  ".join(f"{k}={s * 1000:.0f}ms" for k, s in v["timings"].items()))
    for key in ("result", "annotated"):
        if v[key]:
            out.print(f"  {key}: {v[key]}", highlight=False)


@app.command()
def report(
    last: Annotated[int, typer.Option("--last", help="the most recent N finished pages")] = 1000,
) -> None:
    """Where the time goes: per-stage p50, p95 and share over recently finished pages."""
    from sqlalchemy import select

    from paperlane.storage.db import Database
    from paperlane.storage.jobs import job_timings
    from paperlane.storage.tables import JobRow

    settings = _settings()
    db = Database(settings.database_url)
    db.upgrade()
    with db.session() as s:
        rows = s.scalars(select(JobRow).where(JobRow.finished_at.is_not(None))
                         .order_by(JobRow.finished_at.desc()).limit(last)).all()
    out.print(f"{len(rows)} finished pages")
    _print_time_table([job_timings(r) for r in rows])


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the database schema to the newest version."""
    from paperlane.storage.db import Database

    settings = _settings()
    Database(settings.database_url).upgrade()
    err.print(f"database at newest schema: {settings.database_url.split('@')[-1]}")


def main() -> None:
    try:
        app()
    except UsageError as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False)
        sys.exit(2)
    except PaperlaneError as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False)
        sys.exit(1)
