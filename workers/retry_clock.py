"""The worker's retry clock: puts delayed pages (``paperlane.priority.delayed``) back on their lanes when due.

One thread per worker process. It sleeps until the earliest due time in Redis, or until any worker announces
a newly delayed page (a PUBLISH it is subscribed to), claims the due pages atomically and publishes each as a
fresh message on its own lane at its own priority. Every worker runs one, so a page delayed by a worker that
died since is released by the others. Redis work happens per delayed page, never per unit of time: with
nothing delayed the thread waits on its subscription and sends nothing (it wakes every few seconds, for its
own stop, without a command).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from paperlane.priority import keys
from paperlane.priority.delayed import DelayedPages
from paperlane.priority.messages import PageMessage

log = logging.getLogger(__name__)

Publish = Callable[[list[PageMessage]], None]  # ``priority.broker.PagePublisher.publish``
_WAKE = 2.0  # seconds between looks at the stop flag while nothing is due (no Redis command)


class RetryClock:
    def __init__(self, client: redis.Redis, delayed: DelayedPages, publish: Publish) -> None:
        self._redis = client
        self._delayed = delayed
        self._publish = publish
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="retry-clock", daemon=True)
        self.released = 0  # pages this clock put back on their lanes

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        try:  # wake the thread from its subscription (other workers' clocks just look once more)
            self._redis.publish(keys.DELAYED_CHANNEL, b"0")
        except redis.RedisError:
            pass
        self._thread.join(timeout=10)

    def _run(self) -> None:
        backoff = 0.5
        while not self._stopping.is_set():
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(keys.DELAYED_CHANNEL)
                self._serve(pubsub)
                backoff = 0.5
            except Exception as exc:  # Redis down or restarted: nothing is lost, the set is in Redis
                log.warning("retry clock: %s; again in %.1fs", exc, backoff)
                self._stopping.wait(backoff)
                backoff = min(10.0, backoff * 2)
            finally:
                pubsub.close()

    def _serve(self, pubsub: redis.client.PubSub) -> None:
        """Release due pages whenever the earliest is due or a page was delayed, until stopped."""
        due_at: float | None = time.monotonic()  # look once at start: pages delayed while no clock ran
        while True:
            if due_at is not None and time.monotonic() >= due_at:
                wait = self._release_due()
                due_at = None if wait is None else time.monotonic() + wait
            if self._stopping.is_set():  # after one last release: pages its worker's stop handed back
                self._release_due()
                return
            timeout = _WAKE if due_at is None else max(0.0, min(_WAKE, due_at - time.monotonic()))
            if pubsub.get_message(timeout=timeout) is not None:  # a page was delayed: its due time is news
                due_at = time.monotonic()

    def _release_due(self) -> float | None:
        """Publish every due page; the seconds until the next is due (None: nothing delayed)."""
        while True:
            pages, wait = self._delayed.claim_due()
            if not pages:
                return wait
            self._publish(pages)
            self._delayed.released(pages)
            self.released += len(pages)
            log.info("released %d delayed page(s) onto their lanes", len(pages))
