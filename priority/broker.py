"""The Celery application's configuration, shared by the producer (publishes) and the workers.

Settings verified on celery 5.6/kombu 5.7 with Redis 7: kombu's ``priority`` queue-order strategy
makes message priority (0 first) dominate queue order on Redis; prefetch 1 and late acks keep
reserved-but-not-started messages few, so priority still holds, and a killed worker's message is
redelivered. A message on a lane that is not a page message is set aside, not taken (``priority.transport``).

``PagePublisher`` is the one way a page (``priority.messages.PageMessage``) reaches its lane: the producer's
registration, the worker's retry clock and the lease keeper's sweep (through the delayed set) all end in it.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu.exceptions import BatchPublishError, OperationalError

from paperlane.errors import StorageUnavailable
from paperlane.priority import keys
from paperlane.priority.fair import HEADER, Share
from paperlane.priority.lanes import PRIORITY_STEPS, TASK_PROCESS_PAGE, Lane
from paperlane.priority.connection import SOCKET_TIMEOUT
from paperlane.priority.messages import JOB_HEADER, PageMessage
from paperlane.schemas import Stage
from paperlane.settings import RedisSettings, Settings


def make_celery(settings: Settings) -> Celery:
    """A Celery app bound to the settings' Redis; no tasks registered (the worker adds them)."""
    app = Celery("paperlane", broker=settings.redis.url, set_as_current=False)
    transport = {
        "queue_order_strategy": "priority",
        "priority_steps": PRIORITY_STEPS,
        "sep": keys.PRIORITY_SEP,
        "visibility_timeout": settings.redis.visibility_timeout,
        # How often a worker looks for messages whose worker died (un-acked past the timeout).
        "unacked_restore_interval": min(10.0, max(1.0, settings.redis.visibility_timeout / 4)),
        # Lane messages wait by fair share (priority.fair) behind a buffer of this many on the lane's lists.
        "fair_share": settings.fair_share.enabled,
        "fair_buffer": settings.fair_share.buffer,
        # kombu's own keys (queues, unacked, bindings) and fanout channels under redis.key_prefix, as paperlane's.
        "global_keyprefix": settings.redis.key_prefix,
        **_sentinel_options(settings.redis),
    }
    kind = "SentinelTransport" if settings.redis.sentinels else "Transport"
    app.conf.update(
        # kombu's Redis transport, checking each lane message before kombu reads it (priority.transport).
        broker_transport=f"paperlane.priority.transport:{kind}",
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        task_default_queue=Lane.BATCH.queue,
        task_queues=None,
        task_routes={TASK_PROCESS_PAGE: {"queue": Lane.BATCH.queue}},
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        # Celery events on (Flower, `celery events`): a small message per task a worker receives, starts and
        # ends. Not "task-sent": a bulk submit would publish one more message per page.
        worker_send_task_events=True,
        broker_heartbeat=0,
    )
    if settings.redis.sentinels:
        app.conf.update(
            # A failover (celery#7946): a command on a master demoted to replica answers READONLY, a channel error
            # Celery would stop the worker on; retried like a lost connection instead, which reconnects to the new
            # master.
            broker_channel_error_retry=True,
            broker_connection_max_retries=None,  # a failover may take longer than the default's 100 quick tries
        )
    return app


def send_page(app: Celery, job_id: str, lane: Lane, message_priority: int, *, share: Share | None = None,
              producer: Any = None, declared: bool = False) -> None:
    """Publish one page's message on its lane's queue at its message priority (0 first), waiting there by its
    ``share`` (tenant, ingest, weights; default: the command line's). ``declared``: the caller declared the queue on
    ``producer`` already (Celery would check for every message, a good part of its cost).

    Raises kombu's OperationalError when the broker is unreachable (callers map it).
    """
    # The arguments' repr (Flower, `celery inspect`), what Celery's saferepr gives for a job id, made by repr: saferepr
    # was 2% of a bulk submit's CPU.
    app.send_task(TASK_PROCESS_PAGE, args=[job_id], queue=lane.queue, priority=message_priority, producer=producer,
                  headers={HEADER: (share or Share()).header(), JOB_HEADER: job_id},
                  argsrepr=repr([job_id]), kwargsrepr="{}",
                  **({"declare": []} if declared else {}))


BATCH = 1000  # Redis commands per pipeline when publishing pages (kombu's default batch)


class PagePublisher:
    """Publishes pages, each on its lane's queue at its message priority, behind its fair share."""

    def __init__(self, app: Celery, *, stage: Stage = Stage.UPLOAD) -> None:
        self._app = app
        self._stage = stage  # the stage a broker that cannot be reached is reported at

    def publish(self, pages: list[PageMessage]) -> None:
        """Hand ``pages`` to the workers, over one connection, in pipelines of up to ``BATCH`` Redis commands (a
        page's is one, or two with fair share off). Raises StorageUnavailable when the broker is unreachable (the
        pipelines sent before it are out; of the one that failed, some pages may be)."""
        try:
            with self._app.producer_or_acquire() as producer, producer.batch(max_size=BATCH):
                for lane in sorted({page.lane for page in pages}):
                    producer.maybe_declare(self._app.amqp.queues[lane.queue], retry=True)
                for page in pages:
                    send_page(self._app, page.job_id, page.lane, page.message_priority, share=page.share,
                              producer=producer, declared=True)
        except (OperationalError, BatchPublishError) as exc:
            raise StorageUnavailable(f"broker unreachable: {exc}", stage=self._stage.value) from exc


def _sentinel_options(cfg: RedisSettings) -> dict[str, Any]:
    """kombu's transport options for a ``sentinel://`` URL: the master's name, the Sentinels' password, and
    (celery#6348, a master whose host vanished without closing its sockets) keepalive and timeouts, so a dead
    connection is noticed and the next one goes to the master the Sentinels name."""
    if not cfg.sentinels:
        return {}
    password = cfg.sentinel_password.get_secret_value() if cfg.sentinel_password else None
    return {"master_name": cfg.master_name, "sentinel_kwargs": {"password": password, "socket_timeout": SOCKET_TIMEOUT},
            "socket_keepalive": True, "socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": SOCKET_TIMEOUT,
            "health_check_interval": 5}
