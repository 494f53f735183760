"""The backlog of each lane, as the ``paperlane_queue_depth{lane}`` gauge: what autoscaling reads.

A lane's backlog is its buffer lists (kombu's priority lists, ``lanes.broker_keys``) and the pages waiting by fair
share behind them (``fair.held``, most of it). Both are read from Redis in one pipeline when scraped, so the gauge
is the broker's truth whichever process serves it: every worker (``workers.exporter``) and the API's /metrics, so
that a fleet scaled to zero still shows the pages that should wake it. Pages in progress (delivered, unacked) and
pages due later (``priority.delayed``) are not backlog.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import redis
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from paperlane.priority import fair
from paperlane.priority.lanes import Lane, broker_keys

log = logging.getLogger(__name__)

METRIC = "paperlane_queue_depth"


class QueueDepth(Collector):
    """Messages waiting in each lane (its queue and its fair-share structure), read from Redis when scraped."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(METRIC, "messages waiting on a lane's queue", labels=["lane"])
        try:
            with self._redis.pipeline(transaction=False) as pipe:
                for lane in Lane:
                    for key in broker_keys(lane):
                        pipe.llen(key)
                    fair.held(pipe, lane)
                counts = [fair.count(n) for n in pipe.execute()]
        except redis.RedisError as exc:
            log.warning("queue depth: %s", exc)
            return
        per_lane = len(broker_keys(Lane.BATCH)) + 1
        for i, lane in enumerate(Lane):
            family.add_metric([lane.value], sum(counts[i * per_lane:(i + 1) * per_lane]))
        yield family
