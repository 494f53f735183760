"""``paperlane submit``: an ingest registered and queued for the workers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from paperlane.cli.root import FieldOpt, ForceOpt, LaneOpt, LangOpt, TaskOpt, app, command_settings, err, task_spec
from paperlane.priority.lanes import Lane
from paperlane.schemas import Task
from paperlane.settings import Settings


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
    from paperlane.priority.broker import PagePublisher, make_celery
    from paperlane.producer.input_items import Skipped
    from paperlane.producer.inputs import check_paths, expand
    from paperlane.producer.submit import Submitter
    from paperlane.storage.db import Database
    from paperlane.storage.objects import open_store

    settings = command_settings()
    spec = task_spec(task, field, to)
    local = [Path(p) for p in paths if not p.startswith("s3://")]
    check_paths(local)
    db = Database(settings.database_url)
    db.upgrade()
    store = open_store(settings)
    submitter = Submitter(db=db, store=store, spec=spec, lane=lane, priority=priority, force=force,
                          publisher=PagePublisher(make_celery(settings)), limits=settings.ingest, weight=weight)
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
