"""The long-running processes: ``paperlane worker`` and ``paperlane api``."""

from __future__ import annotations

import logging
from functools import partial
from typing import Annotated

import typer

from paperlane.cli.root import (
    EngineOpt,
    EngineUrlOpt,
    ModelOpt,
    ProfileOpt,
    app,
    command_settings,
    configure_logging,
    global_options,
)
from paperlane.priority.lanes import Lane


@app.command()
def worker(
    engine: EngineOpt = None, engine_url: EngineUrlOpt = None, model: ModelOpt = None, profile: ProfileOpt = None,
    queues: Annotated[str | None, typer.Option("--queues", "-Q", help="comma-separated lane names")] = None,
    hostname: Annotated[str | None, typer.Option("--hostname", "-n")] = None,
) -> None:
    """Run a Celery worker that keeps one OCR engine resident and processes queued pages."""
    from paperlane.workers.feeders import feeder_count, run_feeders
    from paperlane.workers.worker import Worker, celery_argv

    settings = command_settings(engine, engine_url, model, profile)
    level = min(global_options.log_level, logging.INFO)
    configure_logging(level)  # a worker's log is its output
    lanes = [Lane(q.strip()) for q in queues.split(",")] if queues else list(Lane)
    if (feeders := feeder_count(settings)) > 1:
        run_feeders(settings, lanes, hostname, feeders, setup=partial(configure_logging, level))
        return
    assembled = Worker(settings, lanes=lanes)
    assembled.app.worker_main(celery_argv(assembled, hostname=hostname))


@app.command()
def outputs() -> None:
    """Write finished documents' outputs on this host's CPUs, for GPU workers run with worker.write_outputs=false
    (any number of these share the work; /metrics has paperlane_outputs_due to scale them on)."""
    from paperlane.workers.outputs_service import serve as serve_outputs

    settings = command_settings()
    configure_logging(min(global_options.log_level, logging.INFO))
    serve_outputs(settings)


@app.command()
def api(
    host: Annotated[str | None, typer.Option("--host", help="address to listen on (default: api.host)")] = None,
    port: Annotated[int | None, typer.Option("--port", help="port (default: settings, api.port)")] = None,
) -> None:
    """Serve the HTTP API and its web page (OpenAPI at /docs, metrics at /metrics)."""
    from paperlane.producer.api.app import serve
    from paperlane.workers.drawing import drawn_on_request

    settings = command_settings()
    configure_logging(min(global_options.log_level, logging.INFO))
    serve(settings, host=host or settings.api.host, port=port or settings.api.port, draw=drawn_on_request)
