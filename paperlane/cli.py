"""The ``paperlane`` command line: run, submit, worker, status, report, db."""

from __future__ import annotations

import json
import logging
import os
import sys
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from paperlane.errors import PaperlaneError, UsageError
from paperlane.formats.registry import names
from paperlane.priority.lanes import Lane
from paperlane.schemas import PageResult, Task, TaskSpec
from paperlane.settings import EngineKind, EngineSettings, Settings, WorkerSettings, load_settings
from paperlane.status import JobStatus, PageState, RollupState

if TYPE_CHECKING:
    from paperlane.producer.inputs import Skipped
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


def _with_formats(settings: Settings, formats: str | None) -> Settings:
    """``settings`` writing documents in ``formats`` (comma-separated) when given."""
    if formats is None:
        return settings
    try:
        worker = WorkerSettings.model_validate({**settings.worker.model_dump(), "output_formats": formats})
    except ValueError as exc:
        raise UsageError(f"--formats: {_first_error(exc)}") from exc
    return settings.model_copy(update={"worker": worker})


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
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="where each page's <name>.json and "
                                          "<name>.annotated.jpg and each document's outputs go")],
    task: TaskOpt = Task.SPOTTING, field: FieldOpt = None, to: LangOpt = "English",
    lane: LaneOpt = Lane.BATCH, force: ForceOpt = False,
    engine: EngineOpt = None, engine_url: EngineUrlOpt = None, model: ModelOpt = None, profile: ProfileOpt = None,
    formats: Annotated[str | None, typer.Option("--formats", help="each document's outputs, comma-separated: "
                                                f"{', '.join(names())} (default: worker.output_formats, "
                                                "json,md,pdf)")] = None,
) -> None:
    """Process documents in this process (no Redis needed): per page a JSON and an annotated image,
    per document its outputs (by default its markdown, a searchable PDF and, several pages, its JSON)."""
    from paperlane.producer.inputs import check_paths, expand
    from paperlane.workers.embedded import run_embedded
    from paperlane.workers.pipeline import Runtime

    settings = _with_formats(_settings(engine, engine_url, model, profile), formats)
    spec = _spec(task, field, to)
    check_paths(paths)  # usage errors before the engine loads
    _check_out_dir(out_dir)
    rt = Runtime.start(settings)
    try:
        summary = run_embedded(rt, expand(paths, settings.ingest), out_dir=out_dir, spec=spec, lane=lane,
                               force=force, name=_ingest_name(paths), sources=_sources(paths), on_page=_print_page,
                               on_skipped=_print_skipped)
    finally:
        rt.close()
    ok = summary.pages - summary.failed
    skipped = f", {summary.skipped} files skipped" if summary.skipped else ""
    out.print(f"\n{summary.documents} documents, {summary.pages} pages: {ok} succeeded, {summary.failed} failed"
              f"{skipped} in {summary.seconds:.1f}s -> {out_dir}")
    _print_time_table(summary.timings)
    raise typer.Exit(1 if summary.failed else 0)


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir} exists and is not a folder")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out_dir}: cannot create it ({exc.strerror})") from exc
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out_dir} is not writable")


def _ingest_name(paths: list[Path]) -> str:
    names = ", ".join(str(p) for p in paths)
    return names if len(names) <= 200 else names[:197] + "..."


def _sources(paths: list[Path]) -> list[str]:
    return [str(p) if str(p).startswith("s3://") else str(p.resolve()) for p in paths]


def _shown(text: object) -> str:
    """Text from outside (a member's or an ingest's name, a reason) as the terminal shows it: no rich markup, no
    control character (an escape sequence would drive the terminal), no bidirectional override."""
    plain = "".join("\ufffd" if unicodedata.category(c) == "Cc" or c in _BIDI else c for c in str(text))
    return escape(plain)


_BIDI = frozenset("\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _print_skipped(item: Skipped) -> None:
    out.print(f"[yellow]skipped[/] {_shown(item.source)}  {_shown(item.reason)}", highlight=False)


def _print_page(name: str, result: PageResult) -> None:
    total = sum(v for k, v in result.timings.items() if k not in ("upload", "queue_wait"))
    if result.status is JobStatus.SUCCEEDED:
        flag = " (truncated)" if result.truncated else ""
        out.print(f"[green]ok[/]     {_shown(name)}  {len(result.lines)} lines, {len(result.text)} chars, "
                  f"{total:.2f}s{flag}", highlight=False)
    else:
        out.print(f"[red]failed[/] {_shown(name)}  {_shown(result.error)}", highlight=False)


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
    paths: Annotated[list[str], typer.Argument(help="images, PDFs, TIFFs, folders, zip/tar archives, s3://bucket/prefix")],
    task: TaskOpt = Task.SPOTTING, field: FieldOpt = None, to: LangOpt = "English",
    lane: LaneOpt = Lane.BATCH,
    priority: Annotated[int, typer.Option("--priority", help="order within the lane, 0 (first) to 4")] = 0,
    force: ForceOpt = False,
    name: Annotated[str | None, typer.Option("--name", help="the ingest's name (default: the paths)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per page instead of bare job ids")] = False,
    weight: Annotated[float, typer.Option("--weight", help="the ingest's share beside the other ingests waiting "
                                          "in its lane (fair share; 2: twice an ingest of weight 1)")] = 1.0,
) -> None:
    """Register an ingest: upload its documents, one job per page, queue them; print one job id per page.

    Submitting the same paths again after an interruption resumes that ingest."""
    from paperlane.priority.broker import make_celery
    from paperlane.producer.inputs import Skipped, check_paths, expand
    from paperlane.producer.submit import CeleryPublisher, Submitter
    from paperlane.storage.db import Database
    from paperlane.storage.objects import open_store

    settings = _settings()
    spec = _spec(task, field, to)
    local = [Path(p) for p in paths if not p.startswith("s3://")]
    check_paths(local)
    db = Database(settings.database_url)
    db.upgrade()
    store = open_store(settings)
    submitter = Submitter(db=db, store=store, spec=spec, lane=lane, priority=priority, force=force,
                          publisher=CeleryPublisher(make_celery(settings)), limits=settings.ingest, weight=weight)
    sources = [p if p.startswith("s3://") else str(Path(p).resolve()) for p in paths]
    items = expand(paths, settings.ingest, s3=_s3_client(settings) if len(local) < len(paths) else None)
    with _progress(enabled=err.is_terminal) as bar, _resumable(submitter):
        task_id = bar.add_task("submitting", total=None)
        for item in submitter.submit(items, name=name or ", ".join(paths)[:200], sources=sources):
            if isinstance(item, Skipped):
                if as_json:
                    print(json.dumps({"skipped": item.source, "reason": item.reason}), flush=True)
                continue
            bar.advance(task_id)
            if as_json:
                print(json.dumps({"job_id": item.job_id, "page_id": item.page_id, "document_id": item.document_id,
                                  "ingest_id": item.ingest_id, "action": item.action.value, "source": item.source,
                                  "page": item.page_no, "status": item.status.value, "error": item.error}),
                      flush=True)
            else:
                print(item.job_id, flush=True)
    s_ = submitter.summary
    actions = ", ".join(f"{v} {k}" for k, v in sorted(s_.actions.items())) or "no pages"
    resumed = f" (resumed; {s_.skipped_before} documents registered before)" if s_.resumed else ""
    err.print(f"ingest {s_.ingest_id}: {s_.documents} documents, {s_.pages} pages: {actions}; "
              f"{s_.skipped} files skipped{resumed}", highlight=False)


@contextmanager
def _resumable(submitter: Any) -> Iterator[None]:
    """Ctrl-C stops a submit with a line saying how to go on, not a bare "Aborted."."""
    try:
        yield
    except KeyboardInterrupt:
        s_ = submitter.summary
        err.print(f"interrupted: ingest {s_.ingest_id or '(not opened)'} has {s_.documents} documents registered; "
                  "the same command again resumes it", highlight=False)
        raise typer.Exit(130) from None


def _s3_client(settings: Settings) -> Any:
    from paperlane.storage.s3 import S3Store

    return S3Store.from_settings(settings.storage.model_copy(update={"create_bucket": False})).client


def _progress(*, enabled: bool) -> Any:
    from rich.progress import MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), MofNCompleteColumn(),
                    TextColumn("pages"), TimeElapsedColumn(), console=err, disable=not enabled, transient=False)


@app.command()
def worker(
    engine: EngineOpt = None, engine_url: EngineUrlOpt = None, model: ModelOpt = None, profile: ProfileOpt = None,
    queues: Annotated[str | None, typer.Option("--queues", "-Q", help="comma-separated lane names")] = None,
    hostname: Annotated[str | None, typer.Option("--hostname", "-n")] = None,
) -> None:
    """Run a Celery worker that keeps one OCR engine resident and processes queued pages."""
    from paperlane.workers.worker import Worker, celery_argv

    settings = _settings(engine, engine_url, model, profile)
    _configure_logging(min(_state.log_level, logging.INFO))  # a worker's log is its output
    lanes = [Lane(q.strip()) for q in queues.split(",")] if queues else list(Lane)
    assembled = Worker(settings, lanes=lanes)
    assembled.app.worker_main(celery_argv(assembled, hostname=hostname))


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
    from paperlane.storage import ingests, views
    from paperlane.storage import jobs as jobstore
    from paperlane.storage.db import Database
    from paperlane.storage.objects import open_store

    settings = _settings()
    db = Database(settings.database_url)
    if ingest or document:
        view = (_ingest_view(settings, db, ingest) if ingest
                else views.document_view(*ingests.document_progress(db, document or "")))
        if as_json:
            print(json.dumps(view, indent=1))
        else:
            _print_progress(view)
        raise typer.Exit(1 if view[PageState.FAILED.value] else 0)
    if page:
        found = ingests.get_page(db, page)
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
    from paperlane.storage import ingests, views

    row, progress, failures = ingests.ingest_progress(db, ingest_id)
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
    out.print(f"[bold]{kind} {v[f'{kind}_id']}[/]  {_shown(v['name'])}  [{_colour(state)}]{state.value}[/]",
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
        failed = f" ({_shown(v['outputs']['error'])})" if v["outputs"]["error"] else ""
        formats = f": {', '.join(v['outputs']['formats'])}" if v["outputs"].get("formats") else ""
        out.print(f"  outputs {v['outputs']['state']}{formats}{failed}", highlight=False)
    if v.get("pages_per_s"):
        eta = f", about {_duration(v['eta_s'])} left" if v["eta_s"] and not state.final else ""
        out.print(f"  {v['pages_per_s']:.1f} pages/s{eta}")
    if v.get("share") is not None:
        left = f", about {_duration(v['share_eta_s'])} left at that share" if v.get("share_eta_s") else ""
        out.print(f"  {v['share'] * 100:.1f}% of the engine now{left}")
    for f in v["failures"]:
        out.print(f"  [red]{f['pages']:>6}[/] {_shown(f['reason'])}", highlight=False)


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
    out.print(f"  {_shown(v['source'])} page {v['page']}  lane={v['lane']} task={v['task']} attempts={v['attempts']}",
              highlight=False)
    if v["worker"]:
        out.print(f"  held by {_shown(v['worker'])} (lease until {v['lease_until']})", highlight=False)
    if v["error"]:
        out.print(f"  error ({v['error_stage'] or '?'}): {_shown(v['error'])}", highlight=False)
    if v["timings"]:
        out.print("  " + "  ".join(f"{k}={s * 1000:.0f}ms" for k, s in v["timings"].items()))
    for key in ("result", "annotated"):
        if v[key]:
            out.print(f"  {key}: {_shown(v[key])}", highlight=False)


@app.command()
def review(
    ingest: Annotated[str, typer.Option("--ingest", help="an ingest's id")],
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    limit: Annotated[int, typer.Option("--limit", min=1, help="at most this many pages")] = 1000,
) -> None:
    """Pages of an ingest whose results need a person's eyes (a loop stopped, a fallback engine, truncated, empty,
    low confidence), with why and their confidence, by document and page."""
    from paperlane.storage import ingests, views
    from paperlane.storage.db import Database

    db = Database(_settings().database_url)
    shown = [views.review_view(p) for p in ingests.review_pages(db, ingest, limit=limit)]
    if as_json:
        print(json.dumps(shown, indent=1))
        return
    table = Table("source", "page", "flags", "confidence", "engine")
    for v in shown:
        confidence = f"{v['confidence']:.2f}" if v["confidence"] is not None else ""
        table.add_row(_shown(v["source"]), str(v["page_no"]), ", ".join(v["flags"]), confidence,
                      _shown(v["engine"] or ""))
    out.print(table)
    err.print(f"{len(shown)} page{'s' * (len(shown) != 1)} need review", highlight=False)


@app.command()
def report(
    last: Annotated[int, typer.Option("--last", help="the most recent N finished pages")] = 1000,
) -> None:
    """Where the time goes: per-stage p50, p95 and share over recently finished pages."""
    from paperlane.storage.db import Database
    from paperlane.storage.jobs import recent_timings

    settings = _settings()
    timings = recent_timings(Database(settings.database_url), last=last)
    out.print(f"{len(timings)} finished pages")
    _print_time_table(timings)


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the database schema to the newest version."""
    from paperlane.storage.db import Database

    settings = _settings()
    Database(settings.database_url).upgrade()
    err.print(f"database at newest schema: {settings.database_url.split('@')[-1]}")


keys_app = typer.Typer(help="API keys of tenants (the HTTP API).", no_args_is_help=True)
app.add_typer(keys_app, name="keys")


@app.command()
def api(
    host: Annotated[str | None, typer.Option("--host", help="address to listen on (default: api.host)")] = None,
    port: Annotated[int | None, typer.Option("--port", help="port (default: settings, api.port)")] = None,
) -> None:
    """Serve the HTTP API and its web page (OpenAPI at /docs, metrics at /metrics)."""
    from paperlane.producer.api.app import serve

    settings = _settings()
    _configure_logging(min(_state.log_level, logging.INFO))
    serve(settings, host=host or settings.api.host, port=port or settings.api.port)


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option("--tenant", help="the tenant's name (made if new)")],
    interactive: Annotated[bool, typer.Option("--interactive", help="may use the interactive lane")] = False,
) -> None:
    """Make an API key. It is printed once, on stdout; only its hash is kept."""
    from paperlane.storage import tenants
    from paperlane.storage.db import Database

    settings = _settings()
    db = Database(settings.database_url)
    db.upgrade()
    made = tenants.create_key(db, tenant=tenant, interactive=interactive)
    if made.tenant_created:
        err.print(f"tenant {_shown(tenant)} created ({made.tenant_id}); its webhook signing secret: "
                  f"{made.webhook_secret}",
                  highlight=False, soft_wrap=True)
    lanes = "interactive and batch lanes" if interactive else "batch lane only"
    err.print(f"key {made.key[:10]}... for {_shown(tenant)} ({lanes}); store it now, it is not shown again:",
              highlight=False)
    print(made.key)


@keys_app.command("list")
def keys_list(tenant: Annotated[str | None, typer.Option("--tenant")] = None) -> None:
    """API keys (their first characters), tenants, lanes, and whether revoked."""
    from paperlane.storage import tenants
    from paperlane.storage.db import Database

    db = Database(_settings().database_url)
    table = Table("key", "tenant", "lanes", "created", "revoked")
    for key, name in tenants.list_keys(db, tenant):
        table.add_row(f"{key.prefix}...", _shown(name), "interactive, batch" if key.interactive else "batch",
                      key.created_at.strftime("%Y-%m-%d %H:%M"),
                      key.revoked_at.strftime("%Y-%m-%d %H:%M") if key.revoked_at else "")
    out.print(table)


@keys_app.command("revoke")
def keys_revoke(prefix: Annotated[str, typer.Argument(help="the key, or its first 8-10 characters")]) -> None:
    """Revoke a key (API replicas stop accepting it within seconds). A prefix is matched literally."""
    from paperlane.storage import tenants
    from paperlane.storage.db import Database

    n = tenants.revoke_key(Database(_settings().database_url), prefix)
    err.print(f"{n} key{'s' if n != 1 else ''} revoked", highlight=False)
    raise typer.Exit(0 if n else 1)


@keys_app.command("rotate-secret")
def keys_rotate_secret(tenant: Annotated[str, typer.Option("--tenant", help="the tenant's name")]) -> None:
    """Give a tenant a new webhook signing secret, printed once on stdout: every webhook from now on is signed
    with it (the old one stops at once)."""
    from paperlane.storage import tenants
    from paperlane.storage.db import Database

    db = Database(_settings().database_url)
    db.upgrade()
    secret = tenants.rotate_webhook_secret(db, tenant)
    err.print(f"tenant {_shown(tenant)}: new webhook signing secret (not shown again):", highlight=False)
    print(secret)


S3Opt = Annotated[str, typer.Argument(help="s3://BUCKET/PREFIX (a folder; s3://BUCKET/ for the whole bucket)")]


@keys_app.command("grant")
def keys_grant(tenant: Annotated[str, typer.Option("--tenant", help="the tenant's name")], source: S3Opt) -> None:
    """Let a tenant ingest (POST /v1/ingests) the objects under an S3 prefix, read with paperlane's own S3
    credentials. paperlane's own bucket cannot be granted."""
    from paperlane.storage import tenants
    from paperlane.storage.db import Database

    settings = _settings()
    bucket, prefix = _s3_prefix(source)
    if bucket == settings.storage.bucket:
        raise UsageError(f"s3://{bucket} is paperlane's own bucket (storage.bucket): it is never ingestible")
    db = Database(settings.database_url)
    db.upgrade()
    stored = tenants.grant_ingest(db, tenant, bucket, prefix)
    err.print(f"tenant {_shown(tenant)} may ingest s3://{_shown(bucket)}/{_shown(stored)}", highlight=False)


@keys_app.command("ungrant")
def keys_ungrant(tenant: Annotated[str, typer.Option("--tenant", help="the tenant's name")], source: S3Opt) -> None:
    """Withdraw a grant made with ``keys grant`` (ingests already registered go on)."""
    from paperlane.storage import tenants
    from paperlane.storage.db import Database

    bucket, prefix = _s3_prefix(source)
    n = tenants.revoke_grant(Database(_settings().database_url), tenant, bucket, prefix)
    err.print(f"{n} grant{'s' if n != 1 else ''} withdrawn", highlight=False)
    raise typer.Exit(0 if n else 1)


@keys_app.command("grants")
def keys_grants(tenant: Annotated[str | None, typer.Option("--tenant")] = None) -> None:
    """The S3 prefixes each tenant may ingest."""
    from paperlane.storage import tenants
    from paperlane.storage.db import Database

    table = Table("tenant", "may ingest")
    for name, bucket, prefix in tenants.list_grants(Database(_settings().database_url), tenant):
        table.add_row(_shown(name), _shown(f"s3://{bucket}/{prefix}"))
    out.print(table)


def _s3_prefix(source: str) -> tuple[str, str]:
    if not source.startswith("s3://") or not source[5:].partition("/")[0]:
        raise UsageError(f"give s3://BUCKET/PREFIX, not {source}")
    bucket, _, prefix = source[5:].partition("/")
    if any(part in (".", "..") for part in prefix.split("/")):
        raise UsageError("a prefix may not hold . or .. as a path segment")
    return bucket, prefix


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

    settings = _settings()
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

    settings = _settings()
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

    db = Database(_settings().database_url)
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


def main() -> None:
    try:
        app()
    except UsageError as exc:
        err.print(f"[red]error:[/] {_shown(exc)}", highlight=False)
        sys.exit(2)
    except PaperlaneError as exc:
        err.print(f"[red]error:[/] {_shown(exc)}", highlight=False)
        sys.exit(1)


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

    client = open_redis(_settings().redis)
    try:
        letters = DeadLetters(client)
        found = letters.purge() if purge else letters.recent(limit)
    finally:
        client.close()
    if as_json:
        print(json.dumps([asdict(d) for d in found], indent=1, ensure_ascii=False))
        return
    for d in found:
        out.print(f"{d.at}  {d.queue or '?'}  [red]{_shown(d.reason)}[/]", highlight=False)
        message = d.message if len(d.message) <= 300 else d.message[:297] + "..."
        out.print(f"  {'base64 ' if d.encoding == 'base64' else ''}{_shown(message)}", highlight=False)
    err.print(f"{len(found)} dead letters{' purged' if purge else ''}", highlight=False)
