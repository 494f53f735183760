"""Prometheus series of paperlane's processes (prometheus-client's default registry).

The API serves them at ``/metrics``; each worker process on ``metrics.port`` (``workers.exporter``, which
also adds the lanes' queue depths and, where NVML finds a GPU, its memory, utilisation and temperature).
Names are ``paperlane_*``.
"""

from __future__ import annotations

import re

from prometheus_client import Counter, Gauge, Histogram

API_REQUESTS = Counter("paperlane_api_requests", "HTTP API requests by route and status",
                       ["method", "route", "status"])
API_SECONDS = Histogram("paperlane_api_request_seconds", "HTTP API request latency (to the response's start)",
                        ["method", "route"], buckets=(.005, .01, .02, .05, .1, .25, .5, 1, 2.5, 10, 60))
API_PAGES = Counter("paperlane_api_pages_submitted", "pages registered through the API by lane", ["lane"])
WEBHOOKS = Counter("paperlane_webhook_deliveries", "webhook tries by outcome", ["outcome"])

# --- workers (served on metrics.port by each worker process) -----------------------------------------
STAGE_SECONDS = Histogram("paperlane_stage_seconds", "seconds per page in each stage (upload, queue_wait, "
                          "preprocess, inference, postprocess, store)", ["stage"],
                          buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 120, 600))
PAGES = Counter("paperlane_pages", "pages settled by this worker, by outcome (done, failed, retry, handed_back) "
                "and failure reason (digits masked, so the reasons stay few)", ["outcome", "reason"])
BATCH_SIZE = Histogram("paperlane_batch_size", "pages per engine call (micro-batch)",
                       buckets=(1, 2, 4, 8, 16, 32, 64, 128))
ENGINE_IN_FLIGHT = Gauge("paperlane_engine_pages_in_flight", "pages inside engine calls now")
ENGINE_TOKENS = Counter("paperlane_engine_tokens", "tokens the engine decoded for this process's pages, by outcome: "
                        "completed (answers read to their end) or abandoned (answers stopped mid-stream as "
                        "degenerate; the engine freed their sequence)", ["outcome"])
ENGINE_CHUNKS = Counter("paperlane_engine_chunks", "streamed pieces of answers the engine sent this process: "
                        "paperlane_engine_tokens over this is the tokens a chunk (engine.stream_interval)")
PAGE_FLAGS = Counter("paperlane_page_flags", "pages stored with each quality flag (loop_stopped, retried, "
                     "fallback, truncated, empty, low_confidence)", ["flag"])
PAGES_GRADED = Counter("paperlane_pages_graded", "pages stored with a quality grade, by whether they need review",
                       ["needs_review"])
# Per tenant: the tenants with the most pages this month have a label of their own (metrics.tenant_labels), the
# rest count as "other" (workers.exporter.TenantSeries); the usage table is the billing truth, per page.
TENANT_PAGES = Counter("paperlane_tenant_pages", "jobs this worker finished for each tenant, by outcome",
                       ["tenant", "outcome"])
TENANT_TOKENS = Counter("paperlane_tenant_engine_tokens", "engine tokens spent on each tenant's pages by this worker "
                        "(kind: prompt, completion)", ["tenant", "kind"])
TENANT_ENGINE_SECONDS = Counter("paperlane_tenant_engine_seconds", "engine (inference) seconds spent on each "
                                "tenant's pages by this worker", ["tenant"])


def reason_label(reason: str | None) -> str:
    """A failure reason as a label: digits masked and cut short, so per-page details do not explode series."""
    if not reason:
        return ""
    return re.sub(r"\d+(\.\d+)?", "#", reason)[:80]
