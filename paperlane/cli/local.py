"""``paperlane run``: documents processed in this process, outputs written to a folder."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from paperlane.cli.root import (
    EngineOpt,
    EngineUrlOpt,
    FieldOpt,
    ForceOpt,
    LaneOpt,
    LangOpt,
    ModelOpt,
    ProfileOpt,
    TaskOpt,
    app,
    command_settings,
    configure_logging,
    global_options,
    out,
    print_time_table,
    printable,
    task_spec,
    with_formats,
)
from paperlane import heap
from paperlane.errors import UsageError
from paperlane.formats.registry import names
from paperlane.priority.lanes import Lane
from paperlane.schemas import Task
from paperlane.status import JobStatus

if TYPE_CHECKING:
    from paperlane.producer.input_items import Skipped
    from paperlane.workers.embedded import Reported


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
    from paperlane.workers.embedded import RunHost, run_embedded
    from paperlane.workers.pipeline import Runtime
    from paperlane.workers.run_feeders import RunFeeders, run_feeder_count

    settings = with_formats(command_settings(engine, engine_url, model, profile), formats)
    spec = task_spec(task, field, to)
    check_paths(paths)  # usage errors before the engine loads
    _check_out_dir(out_dir)
    feeders = run_feeder_count(settings)
    rt: Runtime | RunHost = RunHost.open(settings) if feeders > 1 else Runtime.start(settings)
    feed = (RunFeeders.start(settings, feeders, out_dir, rt.db, setup=partial(configure_logging,
                                                                              global_options.log_level))
            if feeders > 1 else None)
    heap.after_start()
    try:
        summary = run_embedded(rt, expand(paths, settings.ingest), out_dir=out_dir, spec=spec, lane=lane,
                               force=force, name=_ingest_name(paths), sources=_sources(paths), feed=feed,
                               on_page=_print_page, on_skipped=_print_skipped)
    finally:
        if feed is not None:
            feed.close()
        rt.close()
    ok = summary.pages - summary.failed
    skipped = f", {summary.skipped} files skipped" if summary.skipped else ""
    out.print(f"\n{summary.documents} documents, {summary.pages} pages: {ok} succeeded, {summary.failed} failed"
              f"{skipped} in {summary.seconds:.1f}s -> {out_dir}")
    print_time_table(summary.timings)
    if summary.stopped:
        out.print(f"[red]stopped[/] {printable(summary.stopped)}", highlight=False)
    raise typer.Exit(1 if summary.failed or summary.stopped else 0)


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


def _print_skipped(item: Skipped) -> None:
    out.print(f"[yellow]skipped[/] {printable(item.source)}  {printable(item.reason)}", highlight=False)


def _print_page(name: str, result: Reported) -> None:
    total = sum(v for k, v in result.timings.items() if k not in ("upload", "queue_wait"))
    if result.status is JobStatus.SUCCEEDED:
        flag = " (truncated)" if result.truncated else ""
        out.print(f"[green]ok[/]     {printable(name)}  {result.lines} lines, {result.chars} chars, "
                  f"{total:.2f}s{flag}", highlight=False)
    else:
        out.print(f"[red]failed[/] {printable(name)}  {printable(result.error)}", highlight=False)
