"""A worker's graceful stop (SIGTERM): it takes no new page, finishes those in the engine, hands back the rest.

Celery's warm shutdown stops consuming the lanes and waits for the tasks in progress, however long
the engine takes. Here the pages a worker holds are sorted out as soon as the signal comes
(Celery's ``worker_shutting_down``):

- pages not yet in the engine (being fetched and prepared, or waiting for a place in a batch) are
  handed back at once, so another worker can start them now;
- pages in the engine get ``worker.shutdown_grace`` seconds to come back and be stored; any still
  there then are handed back too (an answer that comes later is dropped).

A page handed back is queued again with its attempt not counted (the retry policy's ``HANDED_BACK``) and
put back on its lane at once through the delayed set, so no page stays ``running`` and none is lost; its
message is acknowledged. Celery then exits with 0. A cold shutdown (SIGQUIT) hands back everything at once.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery.signals import worker_shutting_down

from paperlane.workers.batcher import MicroBatcher

log = logging.getLogger(__name__)


class GracefulStop:
    """Hands back what the batcher holds once ``begin`` is called; its thread waits for that until then."""

    def __init__(self, batcher: MicroBatcher, *, grace: float) -> None:
        self._batcher = batcher
        self._grace = grace
        self._begun = threading.Event()
        self._at_once = threading.Event()
        self._thread = threading.Thread(target=self._run, name="graceful-stop", daemon=True)

    def start(self) -> None:
        """Begin stopping when Celery begins its shutdown (SIGTERM; SIGQUIT: at once)."""
        worker_shutting_down.connect(self._on_shutting_down, weak=False, dispatch_uid=f"paperlane.stop.{id(self)}")
        self._thread.start()

    def stop(self) -> None:
        worker_shutting_down.disconnect(dispatch_uid=f"paperlane.stop.{id(self)}")

    def _on_shutting_down(self, sender: Any = None, how: str = "Warm", **_: Any) -> None:
        self.begin(at_once=how == "Cold")

    def begin(self, *, at_once: bool = False) -> None:
        """Start stopping; ``at_once``: hand back the pages in the engine too, without waiting (also when
        stopping began already). Called in a signal handler: it only sets events (no lock the interrupted
        thread may hold, no logging)."""
        if at_once:
            self._at_once.set()
        self._begun.set()

    def _run(self) -> None:
        self._begun.wait()
        waiting, in_engine = self._batcher.drain()
        log.warning("stopping: %d page(s) waiting for the engine handed back; %d in it get %.0fs to finish",
                    waiting, in_engine, self._grace)
        deadline = time.monotonic() + self._grace
        # In short steps, only while stopping: a cold shutdown (SIGQUIT) meanwhile ends the wait.
        while not self._batcher.wait_idle(min(0.25, max(0.0, deadline - time.monotonic()))):
            if self._at_once.is_set() or time.monotonic() >= deadline:
                log.warning("stopping: %d page(s) still in the engine handed back", self._batcher.give_up())
                return
