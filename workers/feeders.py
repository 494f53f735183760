"""Several feeding processes for one engine: ``paperlane worker`` with ``worker.feeders`` above 1.

A feeding process is a whole worker (``workers.worker.Worker``: its Celery consumer, page slots, micro-batcher,
lane policy, CPU pool and outputs process), all of them sharing the one engine server: each one's window
(``models.window``) reads the server's /metrics and takes its share of the server's queue, so together they keep
it as full as one would. The first feeder is this process; the others are started beside it and stopped after it.
The host's CPUs are divided among them: each feeder's preprocessing pool gets its share (unless
``worker.preprocess_processes`` says), and each serves /metrics on ``metrics.port`` plus its index (0: any port).

The default number follows the host and the engine: a feeder's own process spends about 30 ms of CPU on a page
(the engine client, post-processing, the rows), so one core feeds about 30 pages/s, past what one H200 decodes for
HunyuanOCR (about 20 pages/s). One feeder per ``CPUS_PER_FEEDER`` usable CPUs, at least 1 and at most
``MAX_FEEDERS``: a small host keeps its cores for preprocessing, a large one is not held back by one process's
Python.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess

from paperlane.priority.lanes import Lane
from paperlane.settings import Settings
from paperlane.workers.cpus import available_cpus, pool_processes

log = logging.getLogger(__name__)

CPUS_PER_FEEDER = 8
MAX_FEEDERS = 4
_STOP_WAIT = 120.0  # seconds a stopping feeder may take (its graceful stop included) before it is killed


def feeder_count(settings: Settings, cpus: float | None = None) -> int:
    """``worker.feeders``, or the default: one per ``CPUS_PER_FEEDER`` usable CPUs, from 1 to ``MAX_FEEDERS``."""
    if settings.worker.feeders is not None:
        return settings.worker.feeders
    usable = available_cpus() if cpus is None else cpus
    return max(1, min(MAX_FEEDERS, int(usable // CPUS_PER_FEEDER)))


def feeder_settings(settings: Settings, index: int, count: int, cpus: float | None = None) -> Settings:
    """The settings of feeder ``index`` of ``count``: its share of the CPUs for its preprocessing pool, its own
    metrics port."""
    if count == 1:
        return settings
    usable = available_cpus() if cpus is None else cpus
    worker = settings.worker.model_copy(update={
        "preprocess_processes": pool_processes(settings.worker.preprocess_processes, usable / count)})
    port = settings.metrics.port
    metrics = settings.metrics.model_copy(update={"port": port + index if port else port})
    return settings.model_copy(update={"worker": worker, "metrics": metrics})


def run_feeders(settings: Settings, lanes: list[Lane], hostname: str | None, count: int, *,
                setup: Callable[[], None]) -> None:
    """Run ``count`` feeders: the others in processes of their own (each runs ``setup`` first: the entry point's
    logging; a module-level function or a partial of one), the first in this one (until it stops); then stop the
    others (SIGTERM: their graceful stop) and wait for them."""
    log.info("%d feeding processes share the engine", count)
    ctx = multiprocessing.get_context("spawn")
    others = [ctx.Process(target=_feed, args=(feeder_settings(settings, i, count), lanes, _name(hostname, i), setup),
                          name=f"feeder-{i}") for i in range(1, count)]
    for proc in others:
        proc.start()
    try:
        _feed(feeder_settings(settings, 0, count), lanes, _name(hostname, 0))
    finally:
        _stop(others)


def _feed(settings: Settings, lanes: list[Lane], hostname: str | None, setup: Callable[[], None] | None = None) -> None:
    from paperlane.workers.worker import Worker, celery_argv  # the Celery app: not at import time

    if setup is not None:
        setup()
    worker = Worker(settings, lanes=lanes)
    worker.app.worker_main(celery_argv(worker, hostname=hostname))


def _name(hostname: str | None, index: int) -> str | None:
    if hostname is None or index == 0:
        return hostname
    name, at, host = hostname.partition("@")
    return f"{name}-{index}{at}{host}"


def _stop(procs: Sequence[BaseProcess]) -> None:
    for proc in procs:
        if proc.is_alive() and proc.pid is not None:
            try:
                os.kill(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    for proc in procs:
        proc.join(_STOP_WAIT)
        if proc.is_alive():
            log.warning("%s did not stop in %.0fs: killed", proc.name, _STOP_WAIT)
            proc.kill()
            proc.join()
