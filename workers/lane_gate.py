"""The Celery worker's side of the one scheduler: its consumer of the Redis lane queues as a ``LaneSource``.

Redis hands out messages in strict priority order across both lane queues. The ``LaneScheduler``
decides, on every page received and finished, which lanes this worker may take pages from; this
module carries that out by stopping and resuming consumption of a lane's queue (kombu's public
``Consumer.cancel_by_queue`` / ``add_queue`` + ``consume``) on the consumer's own event loop
(``Consumer.call_soon`` is thread-safe and wakes the loop).

A page counts as started when its message is RECEIVED (Celery's ``task_received`` signal, sent on
the consumer's loop before it asks Redis for the next message), so the lane is closed before another
message of it can be fetched. Whether batch pages are waiting is asked of Redis only when the
policy owes batch a start (once per interactive burst): the cost grows with messages, not with time.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from celery.signals import task_received

from paperlane.priority import fair
from paperlane.priority.lanes import Lane, broker_keys
from paperlane.priority.scheduler import LaneScheduler

log = logging.getLogger(__name__)


class ConsumerLanes:
    """A ``LaneSource`` over a Celery worker's task consumer."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client
        self._batch_keys = broker_keys(Lane.BATCH)
        self._consumer: Any = None
        self._wanted: frozenset[Lane] | None = None

    def attach(self, consumer: Any) -> None:
        """The worker's consumer is running: apply the open lanes decided so far."""
        self._consumer = consumer
        if self._wanted is not None:
            consumer.call_soon(self._apply)

    def detach(self) -> None:
        self._consumer = None

    def batch_waiting(self) -> bool:
        try:
            pipe = self._redis.pipeline(transaction=False)
            for key in self._batch_keys:
                pipe.llen(key)
            fair.held(pipe, Lane.BATCH)  # pages waiting by fair share behind the lane's buffer
            return any(fair.count(n) for n in pipe.execute())
        except redis.RedisError:
            return False  # the consumer notices a broken broker on its own; never block interactive on it

    def open_lanes(self, lanes: frozenset[Lane]) -> None:
        self._wanted = lanes
        if self._consumer is not None:
            self._consumer.call_soon(self._apply)

    def _apply(self) -> None:
        """On the consumer's loop: consume exactly the wanted lanes' queues (of those this worker serves)."""
        c, wanted = self._consumer, self._wanted
        if c is None or wanted is None or c.task_consumer is None:
            return
        queues = c.app.amqp.queues
        for lane in Lane:
            if lane.queue not in queues:
                continue  # this worker does not serve the lane at all (-Q)
            consuming = c.task_consumer.consuming_from(lane.queue)
            if lane in wanted and not consuming:
                c.task_consumer.add_queue(queues[lane.queue])
                c.task_consumer.consume()
            elif lane not in wanted and consuming:
                c.task_consumer.cancel_by_queue(lane.queue)


class LaneGate:
    """Drives a ``LaneScheduler`` from the worker: a received page starts its lane (the task reports finishes),
    and the consumer, once it runs, consumes the lanes the scheduler keeps open."""

    def __init__(self, scheduler: LaneScheduler, source: ConsumerLanes) -> None:
        self.scheduler, self.source = scheduler, source
        self._uid = f"paperlane.lane_gate.{id(self)}"

    def start(self) -> None:
        task_received.connect(self._on_received, weak=False, dispatch_uid=self._uid)

    def stop(self) -> None:
        task_received.disconnect(dispatch_uid=self._uid)

    def consumer_started(self, consumer: Any) -> None:
        self.source.attach(consumer)
        self.scheduler.refresh()

    def consumer_stopped(self) -> None:
        self.source.detach()

    def _on_received(self, sender: Any = None, request: Any = None, **_: Any) -> None:
        queue = ((request.delivery_info if request is not None else None) or {}).get("routing_key")
        lane = Lane.of_queue(queue)
        if lane is not None:
            self.scheduler.started(lane)
