"""A worker's /metrics endpoint: paperlane's series (``paperlane.metrics``), the lanes' queue depths, and the GPU
through NVML when present; and the per-tenant series' bounded labels (``TenantSeries``).

Queue depths (``priority.depth``) are read from Redis at scrape time, so they are the broker's truth whichever
worker is scraped. GPU series come from NVML
(``nvidia-ml-py``): memory used and total, utilisation and temperature per device, so an operator sees memory
pressure before an out-of-memory crash. Where no NVIDIA driver is found, those series are simply absent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from paperlane.metrics import TENANT_ENGINE_SECONDS, TENANT_PAGES, TENANT_TOKENS
from paperlane.priority import keys
from paperlane.settings import Settings
from paperlane.storage import usage
from paperlane.storage.db import Database, utcnow

log = logging.getLogger(__name__)


OTHER = "other"


class TenantSeries:
    """The per-tenant counters, with at most ``labels`` tenants named: a tenant gets a label of its own once it is
    among the ``labels`` tenants with the most pages this month (read from the usage table at most once a
    ``refresh``) and keeps it for the life of the process; the others count as ``other``. Counts made under
    ``other`` stay there, so every series only grows."""

    def __init__(self, db: Database, *, labels: int, refresh: float = 60.0) -> None:
        self._db, self._max, self._refresh = db, labels, refresh
        self._named: dict[str, str] = {}  # tenant id -> its label, for good
        self._top: dict[str, str] = {}
        self._read_at = -refresh
        self._lock = threading.Lock()

    def label(self, tenant_id: str | None) -> str:
        """The label ``tenant_id``'s pages count under (``-``: the command line's)."""
        if not tenant_id or tenant_id == keys.NO_TENANT:
            return keys.NO_TENANT
        with self._lock:
            if tenant_id not in self._named and len(self._named) < self._max:
                self._read_top()
                if tenant_id in self._top:
                    self._named[tenant_id] = self._top[tenant_id]
            return self._named.get(tenant_id, OTHER)

    def _read_top(self) -> None:
        if time.monotonic() - self._read_at < self._refresh:
            return
        self._read_at = time.monotonic()
        try:
            self._top = usage.top_tenants(self._db, since=usage.month_start(utcnow()), limit=self._max)
        except Exception as exc:  # metrics never fail a page
            log.warning("tenant labels: %s", exc)

    def count(self, tenant_id: str | None, outcome: str, work: usage.EngineWork) -> None:
        """A job finished for the tenant (``outcome``: succeeded or failed) with ``work`` spent on it."""
        label = self.label(tenant_id)
        TENANT_PAGES.labels(label, outcome).inc()
        if work.prompt_tokens:
            TENANT_TOKENS.labels(label, "prompt").inc(work.prompt_tokens)
        if work.completion_tokens:
            TENANT_TOKENS.labels(label, "completion").inc(work.completion_tokens)
        if work.seconds:
            TENANT_ENGINE_SECONDS.labels(label).inc(work.seconds)


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
    """This process's /metrics server on ``metrics.port`` (0: any free port; unset: none), with ``collectors`` (a
    worker's: the queue depths, ``QueueDepth``) and the GPU's registered while it runs."""

    def __init__(self, settings: Settings, *collectors: Collector) -> None:
        self._settings = settings
        self._collectors: list[Collector] = list(collectors)
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
