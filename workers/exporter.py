"""A worker's /metrics endpoint: paperlane's series (``paperlane.metrics``), the lanes' queue depths, and the GPU
through NVML when present.

Queue depths are read from Redis at scrape time (every priority list of each lane), so they are the
broker's truth whichever worker is scraped. GPU series come from NVML (``nvidia-ml-py``): memory used and
total, utilisation and temperature per device, so an operator sees memory pressure before an out-of-memory
crash. Where no NVIDIA driver is found, those series are simply absent.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import redis
from prometheus_client import REGISTRY, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from paperlane.priority.lanes import Lane, broker_keys
from paperlane.settings import Settings

log = logging.getLogger(__name__)


class QueueDepth(Collector):
    """Messages waiting on each lane's queue, read from Redis when scraped."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("paperlane_queue_depth", "messages waiting on a lane's queue", labels=["lane"])
        try:
            with self._redis.pipeline(transaction=False) as pipe:
                for lane in Lane:
                    for key in broker_keys(lane):
                        pipe.llen(key)
                counts = pipe.execute()
        except redis.RedisError as exc:
            log.warning("queue depth: %s", exc)
            return
        per_lane = len(broker_keys(Lane.BATCH))
        for i, lane in enumerate(Lane):
            family.add_metric([lane.value], sum(counts[i * per_lane:(i + 1) * per_lane]))
        yield family


class Nvml(Collector):
    """Each NVIDIA GPU's memory, utilisation and temperature; nothing where NVML finds no GPU."""

    def __init__(self) -> None:
        self._nvml: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception as exc:  # no library, no driver, no device: the GPU series are absent
            log.info("no GPU metrics: %s", exc)

    @property
    def present(self) -> bool:
        return self._nvml is not None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self._nvml is None:
            return
        nv = self._nvml
        used = GaugeMetricFamily("paperlane_gpu_memory_used_bytes", "GPU memory in use", labels=["gpu"])
        total = GaugeMetricFamily("paperlane_gpu_memory_total_bytes", "GPU memory", labels=["gpu"])
        util = GaugeMetricFamily("paperlane_gpu_utilization_ratio", "share of time the GPU was busy", labels=["gpu"])
        temp = GaugeMetricFamily("paperlane_gpu_temperature_celsius", "GPU temperature", labels=["gpu"])
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(i)
                memory = nv.nvmlDeviceGetMemoryInfo(handle)
                used.add_metric([str(i)], float(memory.used))
                total.add_metric([str(i)], float(memory.total))
                util.add_metric([str(i)], nv.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)
                temp.add_metric([str(i)], float(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)))
        except nv.NVMLError as exc:
            log.warning("GPU metrics: %s", exc)
            return
        yield from (used, total, util, temp)


class MetricsServer:
    """This process's /metrics server on ``metrics.port`` (0: any free port; unset: none), with the queue depths
    and GPU collectors registered while it runs."""

    def __init__(self, settings: Settings, client: redis.Redis) -> None:
        self._settings = settings
        self._collectors: list[Collector] = [QueueDepth(client)]
        if settings.metrics.nvml:
            nvml = Nvml()
            if nvml.present:
                self._collectors.append(nvml)
        self._server: Any = None
        self.port: int | None = None

    def start(self) -> None:
        if self._settings.metrics.port is None:
            return
        for collector in self._collectors:
            REGISTRY.register(collector)
        self._server, _ = start_http_server(self._settings.metrics.port, addr="0.0.0.0")
        self.port = int(self._server.server_port)
        log.info("metrics on :%d/metrics", self.port)

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._server = None
        for collector in self._collectors:
            REGISTRY.unregister(collector)
