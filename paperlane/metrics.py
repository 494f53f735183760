"""Prometheus series of paperlane's processes (prometheus-client's default registry).

The API serves them at ``/metrics``; names are ``paperlane_*``.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

API_REQUESTS = Counter("paperlane_api_requests", "HTTP API requests by route and status",
                       ["method", "route", "status"])
API_SECONDS = Histogram("paperlane_api_request_seconds", "HTTP API request latency (to the response's start)",
                        ["method", "route"], buckets=(.005, .01, .02, .05, .1, .25, .5, 1, 2.5, 10, 60))
API_PAGES = Counter("paperlane_api_pages_submitted", "pages registered through the API by lane", ["lane"])
WEBHOOKS = Counter("paperlane_webhook_deliveries", "webhook tries by outcome", ["outcome"])
