"""The root of the ``paperlane`` command: the typer app, its global options, the consoles, the shared options
and settings, and ``main`` (the entry point, which turns errors into exit codes)."""

from __future__ import annotations

import logging
import sys
import unicodedata
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from paperlane.errors import PaperlaneError, UsageError, first_error
from paperlane.priority.lanes import Lane
from paperlane.schemas import Task, TaskSpec
from paperlane.settings import EngineKind, EngineSettings, Settings, WorkerSettings, load_settings

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="paperlane: scanned documents to structured text, from one page to millions.")
db_app = typer.Typer(help="Database maintenance.", no_args_is_help=True)
app.add_typer(db_app, name="db")

out = Console()
err = Console(stderr=True)


class GlobalOptions:
    config: Path | None = None
    log_level: int = logging.WARNING


global_options = GlobalOptions()

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
    global_options.config = config
    global_options.log_level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    configure_logging(global_options.log_level)


def configure_logging(level: int, process: str | None = None) -> None:
    """Logging to stderr at ``level``; ``process``: a name every line carries (a feeding process's)."""
    named = f"{process} " if process else ""
    logging.basicConfig(level=level, stream=sys.stderr, force=True,
                        format=f"%(asctime)s %(levelname)s {named}%(name)s: %(message)s")
    for noisy in ("botocore", "boto3", "urllib3", "RapidOCR", "alembic", "httpx", "kombu", "celery.redirected"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))


def command_settings(engine: EngineKind | None = None, engine_url: str | None = None, model: str | None = None,
              profile: str | None = None) -> Settings:
    try:
        settings = load_settings(global_options.config)
        overrides = {k: v for k, v in
                     {"kind": engine, "url": engine_url, "model": model, "profile": profile}.items() if v is not None}
        if overrides:
            merged = EngineSettings.model_validate({**settings.engine.model_dump(), **overrides})
            settings = settings.model_copy(update={"engine": merged})
        return settings
    except ValueError as exc:
        raise UsageError(first_error(exc)) from exc


def with_formats(settings: Settings, formats: str | None) -> Settings:
    """``settings`` writing documents in ``formats`` (comma-separated) when given."""
    if formats is None:
        return settings
    try:
        worker = WorkerSettings.model_validate({**settings.worker.model_dump(), "output_formats": formats})
    except ValueError as exc:
        raise UsageError(f"--formats: {first_error(exc)}") from exc
    return settings.model_copy(update={"worker": worker})


def task_spec(task: Task, fields: list[str] | None, to: str) -> TaskSpec:
    try:
        return TaskSpec(task=task, fields=tuple(fields or ()), target_language=to)
    except ValueError as exc:
        raise UsageError(first_error(exc)) from exc


def printable(text: object) -> str:
    """Text from outside (a member's or an ingest's name, a reason) as the terminal shows it: no rich markup, no
    control character (an escape sequence would drive the terminal), no bidirectional override."""
    plain = "".join("\ufffd" if unicodedata.category(c) == "Cc" or c in _BIDI else c for c in str(text))
    return escape(plain)


_BIDI = frozenset("\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def print_time_table(timings: list[dict[str, float]]) -> None:
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


def main() -> None:
    try:
        app()
    except UsageError as exc:
        err.print(f"[red]error:[/] {printable(exc)}", highlight=False)
        sys.exit(2)
    except PaperlaneError as exc:
        err.print(f"[red]error:[/] {printable(exc)}", highlight=False)
        sys.exit(1)
