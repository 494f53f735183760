"""The lane governor: a Celery consumer step that applies ``LanePolicy`` to what the worker fetches.

Redis hands out messages in strict priority order across both lane queues, so under endless
interactive traffic a worker would never fetch a batch page; and under a batch backlog every slot
would hold a batch page, so an interactive page would wait for one to free. Fifty times a second
this step asks the policy which lanes must not start pages now and stops consuming their queues
until they may again: the interactive queue while batch is owed a start, the batch queue while
batch pages fill their share of the slots.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from celery import Celery, bootsteps

from paperlane.priority.lanes import Lane, broker_keys
from paperlane.priority.policy import LanePolicy

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
            self.paused: set[Lane] = set()
            self.tref: Any = None

        def start(self, c: Any) -> None:
            self.paused = set()
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
            blocked = policy.blocked(batch_waiting=waiting)
            for lane in blocked - self.paused:
                c.cancel_task_queue(lane.queue)
            for lane in self.paused - blocked:
                c.add_task_queue(lane.queue)
            self.paused = blocked

    app.steps["consumer"].add(LaneGovernor)


def _any_waiting(client: redis.Redis, keys: list[str]) -> bool:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.llen(key)
    return any(pipe.execute())
