"""kombu's Redis transport, with every message popped off a lane queue checked before kombu reads it.

kombu parses a popped message inside the worker's consumer loop: one that is not JSON, or not shaped
like a kombu message, raises there and ends the worker (``Unrecoverable error: JSONDecodeError``),
and the message, popped already, is gone. Here the Redis client that pops lane messages checks each
one first (``priority.messages``): a bad one goes to the dead-letter list (``priority.deadletter``)
with its reason, and kombu is told nothing arrived (an empty pop, as when a blocking pop times out),
so the consumer simply asks for the next message. Messages of other queues (Celery's replies to
``celery inspect``) pass as they are.

``priority.broker.make_celery`` selects this transport for paperlane's Celery app, the producer's and
the workers' alike; the queues, keys and priorities are kombu's Redis layout, unchanged.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import redis
from kombu.transport import redis as kombu_redis

from paperlane.priority.deadletter import DeadLetters
from paperlane.priority.lanes import Lane
from paperlane.priority.messages import BadMessage, page_job_id

log = logging.getLogger(__name__)

SetAside = Callable[[str, bytes, str], None]  # (key, message, reason)


class _LaneCheckingRedis(redis.Redis):
    """The channel's Redis client: a message popped (BRPOP) off a lane queue is checked before kombu sees it."""

    def __init__(self, *args: Any, set_aside: SetAside, sep: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._set_aside = set_aside
        self._sep = sep

    def parse_response(self, connection: Any, command_name: str | bytes, **options: Any) -> Any:
        response = super().parse_response(connection, command_name, **options)
        if command_name != "BRPOP" or not response:
            return response
        key, raw = response
        key = key.decode() if isinstance(key, bytes) else key
        if Lane.of_queue(key.rsplit(self._sep, 1)[0]) is None:
            return response
        try:
            page_job_id(raw)
        except BadMessage as exc:
            self._set_aside(key, raw, exc.reason)
            return None  # kombu: nothing arrived before the timeout; it pops again
        return response


class Channel(kombu_redis.Channel):
    def _get_client(self) -> Any:
        super()._get_client()  # kombu's check of the redis-py version (paperlane sets no global_keyprefix)
        return functools.partial(_LaneCheckingRedis, set_aside=self._set_aside, sep=self.sep)

    def _set_aside(self, key: str, raw: bytes, reason: str) -> None:
        queue = key.rsplit(self.sep, 1)[0]
        with self.conn_or_acquire() as client:  # a pooled connection, not the one waiting on BRPOP
            DeadLetters(client).add(raw, reason=reason, queue=queue)


class Transport(kombu_redis.Transport):
    Channel = Channel
