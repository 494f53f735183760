"""The lane governor: a Celery consumer step that applies ``LanePolicy`` to what the worker fetches.

Redis hands out messages in strict priority order across both lane queues, so under endless
interactive traffic a worker would never fetch a batch page. Several times a second this step
checks whether batch is owed the next start (batch pages waiting in Redis, and ``burst``
interactive pages started since the last batch one); if so it stops consuming the interactive
queue until a batch page has started, then consumes it again.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from celery import Celery, bootsteps

from priority.lanes import Lane, broker_keys
from priority.policy import LanePolicy

log = logging.getLogger(__name__)

TICK_S = 0.02


def install_governor(app: Celery, policy: LanePolicy, redis_url: str) -> None:
    """Add the governor to ``app``'s worker consumer."""
    client = redis.Redis.from_url(redis_url, socket_timeout=2)
    batch_keys = broker_keys(Lane.BATCH)

    class LaneGovernor(bootsteps.StartStopStep):
        requires = {"celery.worker.consumer.tasks:Tasks"}

        def __init__(self, parent: Any, **kwargs: Any) -> None:
            super().__init__(parent, **kwargs)
            self.paused = False
            self.tref: Any = None

        def start(self, c: Any) -> None:
            self.paused = False
            self.tref = c.timer.call_repeatedly(TICK_S, self.tick, (c,), priority=10)

        def stop(self, c: Any) -> None:
            if self.tref is not None:
                self.tref.cancel()
                self.tref = None

        def tick(self, c: Any) -> None:
            try:
                waiting = _any_waiting(client, batch_keys)
            except redis.RedisError:
                return  # the consumer notices a broken broker on its own
            owed = policy.batch_owed(batch_waiting=waiting)
            if owed and not self.paused:
                c.cancel_task_queue(Lane.INTERACTIVE.queue)
                self.paused = True
                log.debug("interactive lane paused: batch is owed a start")
            elif not owed and self.paused:
                c.add_task_queue(Lane.INTERACTIVE.queue)
                self.paused = False

    app.steps["consumer"].add(LaneGovernor)


def _any_waiting(client: redis.Redis, keys: list[str]) -> bool:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.llen(key)
    return any(pipe.execute())
