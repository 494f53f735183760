"""The worker's retry clock: puts delayed pages (``paperlane.priority.delayed``) back on their lanes when due.

One thread per worker process. It sleeps until the earliest due time in Redis, or until any worker
announces a newly delayed page (a PUBLISH it is subscribed to), claims the due pages atomically and
publishes each as a fresh message on its own lane at its own priority. Every worker runs one, so a
page delayed by a worker that died since is released by the others. Redis work happens per delayed
page, never per unit of time: with nothing delayed the thread blocks on its subscription.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

from paperlane.priority.delayed import DelayedPage, DelayedPages
from paperlane.priority.lanes import DELAYED_CHANNEL

log = logging.getLogger(__name__)

Publish = Callable[[list[DelayedPage]], None]


class RetryClock:
    def __init__(self, redis_url: str, publish: Publish) -> None:
        self._url = redis_url
        self._publish = publish
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="retry-clock", daemon=True)
        self.released = 0  # pages this clock put back on their lanes

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        try:  # wake the thread from its subscription (other workers' clocks just check once more)
            redis.Redis.from_url(self._url, socket_timeout=2).publish(DELAYED_CHANNEL, b"0")
        except redis.RedisError:
            pass
        self._thread.join(timeout=10)

    def _run(self) -> None:
        backoff = 0.5
        while not self._stopping.is_set():
            delayed = DelayedPages.from_url(self._url)
            pubsub = delayed_client(self._url).pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(DELAYED_CHANNEL)
                while True:
                    wait = self._release_due(delayed)
                    if self._stopping.is_set():  # after one last release: pages its worker's stop handed back
                        break
                    pubsub.get_message(timeout=wait)  # None: block until a page is delayed
                    backoff = 0.5
            except Exception as exc:  # Redis down or restarted: nothing is lost, the set is in Redis
                log.warning("retry clock: %s; again in %.1fs", exc, backoff)
                self._stopping.wait(backoff)
                backoff = min(10.0, backoff * 2)
            finally:
                pubsub.close()
                delayed.close()

    def _release_due(self, delayed: DelayedPages) -> float | None:
        """Publish every due page; the seconds until the next is due (None: nothing delayed)."""
        while True:
            pages, wait = delayed.claim_due()
            if not pages:
                return wait
            self._publish(pages)
            delayed.released(pages)
            self.released += len(pages)
            log.info("released %d delayed page(s) onto their lanes", len(pages))


def delayed_client(url: str) -> redis.Redis:
    # No read timeout: the subscription blocks until a message arrives; health checks spot a dead server.
    return redis.Redis.from_url(url, socket_connect_timeout=5, health_check_interval=30, socket_keepalive=True)
