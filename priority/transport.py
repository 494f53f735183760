"""kombu's Redis transport, with every message popped off a lane queue checked before kombu reads it.

kombu parses a popped message inside the worker's consumer loop: one that is not JSON, or not shaped
like a kombu message, raises there and ends the worker (``Unrecoverable error: JSONDecodeError``),
and the message, popped already, is gone. Here the Redis client that pops lane messages checks each
one first (``priority.messages``): a bad one goes to the dead-letter list (``priority.deadletter``)
with its reason, and kombu is told nothing arrived (an empty pop, as when a blocking pop times out),
so the consumer simply asks for the next message. Messages of other queues (Celery's replies to
``celery inspect``) pass as they are.

Fair share (``priority.fair``): a page message published to a lane queue does not go onto the lane's list
(kombu's LPUSH) but into the lane's fair-share structure, whose script refills the list, now a short buffer;
after each lane message a worker pops, it refills the buffer by one (on a pooled connection, not the one waiting
on BRPOP). Transport options ``fair_share`` (on) and ``fair_buffer`` (the buffer's size) come from the settings.
The size and purge of a lane queue (``celery inspect``, ``celery purge``) count the structure too.

``redis.key_prefix`` (``global_keyprefix`` here): kombu prefixes its own keys; paperlane's scripts and keys go
through a client of ``priority.keyspace`` on the same pool, which prefixes every key of a script, not the first only.

``priority.broker.make_celery`` selects this transport for paperlane's Celery app, the producer's and
the workers' alike (``SentinelTransport`` for ``sentinel://`` URLs); the queues, keys and priorities are kombu's
Redis layout, unchanged.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps

from paperlane.priority import fair, keys
from paperlane.priority.deadletter import DeadLetters
from paperlane.priority.keyspace import with_prefix
from paperlane.priority.lanes import Lane
from paperlane.priority.messages import JOB_HEADER, BadMessage, page_job_id, page_share

log = logging.getLogger(__name__)

SetAside = Callable[[str, bytes, str], None]  # (key, message, reason)
Popped = Callable[[Lane, str | None], None]  # (lane, the popped page's job id)


class _LaneChecking(redis.Redis):
    """The channel's Redis client: a message popped (BRPOP) off a lane queue is checked before kombu sees it."""

    def __init__(self, *args: Any, set_aside: SetAside, popped: Popped, sep: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._set_aside = set_aside
        self._popped = popped
        self._sep = sep

    def parse_response(self, connection: Any, command_name: str | bytes, **options: Any) -> Any:
        response = super().parse_response(connection, command_name, **options)
        if command_name != "BRPOP" or not response:
            return response
        key, raw = response
        key = key.decode() if isinstance(key, bytes) else key
        lane = Lane.of_queue(key.rsplit(self._sep, 1)[0])
        if lane is None:
            return response
        try:
            job_id = page_job_id(raw)
        except BadMessage as exc:
            self._popped(lane, None)
            self._set_aside(key, raw, exc.reason)
            return None  # kombu: nothing arrived before the timeout; it pops again
        self._popped(lane, job_id)
        return response


class _LaneCheckingRedis(_LaneChecking):
    pass


class _PrefixedLaneCheckingRedis(_LaneChecking, kombu_redis.PrefixedStrictRedis):
    """kombu's client with ``global_keyprefix``: it strips the prefix off a popped key before the check reads it."""


class Channel(kombu_redis.Channel):
    fair_share = True
    fair_buffer = 4
    # kombu types the attribute as its own tuple's exact shape; two more options make it longer.
    from_transport_options = (*kombu_redis.Channel.from_transport_options, "fair_share", "fair_buffer")  # type: ignore[assignment]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fair: fair.FairLanes | None = None

    @property
    def lanes(self) -> fair.FairLanes:
        """The fair-share scripts (registered on first use)."""
        if self._fair is None:
            with self._own_client() as client:
                self._fair = fair.FairLanes(client, buffer=int(self.fair_buffer))
        return self._fair

    def _connparams(self, asynchronous: bool = False) -> Any:
        # A broker lost mid-run (a failover): Celery collects the connection, then closes it again, and the channel's
        # close (giving back its un-acked messages) asks for a new pool of a connection that is gone: kombu's
        # AttributeError there ends the worker. A connection error instead is ignored by that close; the messages
        # stay un-acked, for kombu's restore or the lost-message sweep (``workers.leases``).
        if self.connection.client is None:
            raise redis.ConnectionError("the broker connection was closed")
        return super()._connparams(asynchronous)

    def _get_client(self) -> Any:
        super()._get_client()  # kombu's check of the redis-py version
        client = _PrefixedLaneCheckingRedis if self.global_keyprefix else _LaneCheckingRedis
        prefix = {"global_keyprefix": self.global_keyprefix} if self.global_keyprefix else {}
        return functools.partial(client, set_aside=self._set_aside, popped=self._popped, sep=self.sep, **prefix)

    @contextmanager
    def _own_client(self) -> Iterator[redis.Redis]:
        """A pooled client for paperlane's own keys and scripts: kombu's prefixed client prefixes only the first
        key of a script, paperlane's (``priority.keyspace``) every one."""
        with self.conn_or_acquire() as client:
            yield with_prefix(client, self.global_keyprefix)

    def create_publish_batch(self, max_size: int) -> kombu_redis.PublishBatch:
        """kombu's publish batch (``Producer.batch``), on paperlane's prefixed client: a lane message's script is one
        more command in its pipeline (``PagePublisher`` sends a chunk's pages in one round trip)."""
        return _PublishBatch(self, max_size)

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        lane = Lane.of_queue(queue)
        if lane is None:
            super()._put(queue, message, **kwargs)
            return
        raw = dumps(message)
        job_id = _job_id(raw, message.get("headers"))
        batch: kombu_redis.PublishBatch | None = kwargs.get("_publish_batch")
        if not self.fair_share:
            super()._put(queue, message, **kwargs)
            if job_id and batch is not None:  # after the message, in the same pipeline
                batch.add("sadd", keys.PRESENT, job_id)
            elif job_id:  # after the message: a marker lost alone costs a duplicate, never a page
                with self.conn_or_acquire() as client:
                    client.sadd(keys.PRESENT, job_id)
            return
        share = page_share(message.get("headers") or {})
        # A lane's messages keep to its priorities: a batch message cannot claim an interactive one.
        own = fair.lane_priorities(lane)
        priority = min(max(self._get_message_priority(message, reverse=False), own[0]), own[-1])
        if batch is not None:
            batch.add("execute_command", *self.lanes.put_command(batch.pipeline, lane, raw, priority, share,
                                                                 job_id=job_id))
            return
        with self._own_client() as client:
            self.lanes.put(lane, raw, priority, share, client=client, job_id=job_id)

    def _popped(self, lane: Lane, job_id: str | None) -> None:
        """A message of ``lane`` left its buffer: move the next one in by fair share (which takes that one's job id
        out of the presence set, ``priority.presence``), or, with fair share off, take this one's out."""
        try:
            with self._own_client() as client:
                if self.fair_share:
                    self.lanes.refill(lane, client=client)
                elif job_id:
                    client.srem(keys.PRESENT, job_id)
        except redis.RedisError as exc:  # the consumer notices a broken broker on its own; the sweep refills
            log.warning("fair share: refill of %s failed: %s", lane.value, exc)

    def _do_restore_message(self, payload: dict[str, Any], exchange: str, routing_key: str, pipe: Any,
                            leftmost: bool = False) -> None:
        """kombu puts an un-acked message back on its queue (a worker stopped, or its visibility timeout ran out):
        present again, in the same transaction."""
        super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)
        if job_id := _job_id(dumps(payload)):
            pipe.sadd(keys.PRESENT, job_id)

    def _size(self, queue: str) -> int:
        size = int(super()._size(queue))
        lane = Lane.of_queue(queue)
        if lane is None:
            return size
        with self._own_client() as client:
            pipe = client.pipeline(transaction=False)
            fair.held(pipe, lane)
            return size + fair.count(pipe.execute()[0])

    def _purge(self, queue: str) -> int:
        purged = int(super()._purge(queue))
        lane = Lane.of_queue(queue)
        if lane is None:
            return purged
        with self._own_client() as client:
            return purged + self.lanes.purge(lane, client=client)

    def _set_aside(self, key: str, raw: bytes, reason: str) -> None:
        queue = key.rsplit(self.sep, 1)[0]
        with self._own_client() as client:  # a pooled connection, not the one waiting on BRPOP
            DeadLetters(client).add(raw, reason=reason, queue=queue)


class _PublishBatch(kombu_redis.PublishBatch):
    """kombu's batch with its pipeline on a client of ``priority.keyspace`` (kombu's own prefixes only the first key
    of a script, and a lane message is a script): kombu's commands and paperlane's scripts, one pipeline."""

    def __init__(self, channel: Channel, max_size: int) -> None:
        super().__init__(channel, max_size)
        client = self._stack.enter_context(channel._own_client())
        self.pipeline = self._stack.enter_context(client.pipeline(transaction=False))


def _job_id(raw: str | bytes, headers: dict[str, Any] | None = None) -> str | None:
    """The page's job id: its producer's header (``broker.send_page``), else read from ``raw`` (validated; a
    quarter of the cost of publishing a page); None for a message that is not a page's."""
    if headers and isinstance(job_id := headers.get(JOB_HEADER), str):
        return job_id
    try:
        return page_job_id(raw.encode() if isinstance(raw, str) else raw)
    except BadMessage:
        return None  # not a page's message (Celery's own): nothing to mark


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """The same channel on a Redis found through its Sentinels (kombu's ``SentinelChannel``: every new connection
    asks them for the master, so a reconnect after a failover reaches the new one)."""

    # kombu types the attribute as its own tuple's exact shape; the Sentinel options make it longer.
    from_transport_options = (*Channel.from_transport_options,  # type: ignore[assignment]
                              *(o for o in kombu_redis.SentinelChannel.from_transport_options
                                if o not in Channel.from_transport_options))


class SentinelTransport(Transport):
    """``sentinel://host:26379;sentinel://...`` URLs, with ``master_name`` in the transport options."""

    Channel = SentinelChannel
    default_port = 26379  # type: ignore[assignment]  # kombu declares it None on the base transport
