"""``paperlane outputs``: finished documents' outputs written by CPU-only processes, scaled apart from GPU workers.

A GPU worker run with ``worker.write_outputs`` false builds no document outputs: the transaction that finishes a
document still makes its outputs due (``storage.outputs``), and they wait there, recorded, for this service. It
claims due outputs (``Writer.claim_due``: one UPDATE that only one claimant wins, so any number of these services
share the work) and builds them on ``worker.output_processes`` processes (``OutputsPool``: each bounded in memory
and time, as in a worker), a batch at a time, as fast as the processes take them; with none due, it looks again
every ``poll`` seconds (one query on a partial index). Its /metrics (``metrics.port``) has
``paperlane_outputs_due``, the documents whose outputs are due, read from the database when scraped: what an
autoscaler scales these services on (deploy/k8s). A service that stops (SIGTERM) finishes what it claimed; what
it had not finished is due again when its claims lapse (``worker.page_timeout``).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from paperlane import heap
from paperlane.settings import Settings
from paperlane.storage import outputs as recorded
from paperlane.storage.db import Database
from paperlane.storage.objects import open_store
from paperlane.workers.exporter import MetricsServer
from paperlane.workers.outputs_pool import OutputsPool, output_processes, writer_of

log = logging.getLogger(__name__)

METRIC = "paperlane_outputs_due"


class OutputsDue(Collector):
    """Documents whose outputs are due, read from the database when scraped."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            due = recorded.due_count(self._db)
        except Exception as exc:  # the database is down: no sample, and the scrape says so by its absence
            log.warning("outputs due: %s", exc)
            return
        yield GaugeMetricFamily(METRIC, "documents whose outputs are due (written by paperlane outputs)", value=due)


class OutputsService:
    """Claims due outputs and has them written until ``stop``; see the module docstring."""

    def __init__(self, settings: Settings, *, poll: float = 0.25) -> None:
        # Its pool's processes whatever worker.write_outputs says (that setting is the GPU workers'): at least one.
        settings = settings.model_copy(update={"worker": settings.worker.model_copy(update={
            "write_outputs": True, "output_processes": max(1, settings.worker.output_processes or 1)})})
        self.settings, self.poll = settings, poll
        self.db = Database(settings.database_url, pool_size=settings.database.pool_size)
        self.db.upgrade()
        self.pool = OutputsPool(settings, writer_of(settings, self.db, open_store(settings)))
        self.batch = 4 * output_processes(settings)
        self.stopping = threading.Event()
        self.claimed = 0  # documents claimed (and handed to the pool) so far

    def run(self) -> None:
        """Claim and write until ``stop``; then finish what was claimed."""
        metrics = MetricsServer(self.settings, OutputsDue(self.db))
        metrics.start()
        log.info("writing due document outputs on %d process(es)", output_processes(self.settings))
        try:
            while not self.stopping.is_set():
                try:
                    claimed = self.pool.write_due(limit=self.batch)
                except Exception as exc:  # the database is down: the outputs stay due, recorded
                    log.warning("outputs: %s", exc)
                    claimed = 0
                self.claimed += claimed
                if not claimed:
                    self.stopping.wait(self.poll)
        finally:
            self.pool.close()  # what was claimed is written first
            metrics.stop()
            self.db.dispose()

    def stop(self) -> None:
        self.stopping.set()


def serve(settings: Settings) -> None:
    """Run ``OutputsService`` in this process until SIGTERM or SIGINT."""
    service = OutputsService(settings)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: service.stop())
    heap.after_start()
    service.run()
