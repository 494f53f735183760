"""Locust load test of a running paperlane API (issue 25): several tenants, each user one of them, mixing uploads,
status polls, event streams, result downloads and archive-format builds.

    PAPERLANE_LOAD_KEYS=pl_key1,pl_key2,pl_key3 locust -f benchmarks/load/locustfile.py --headless \\
        --host http://127.0.0.1:8000 -u 30 -r 10 -t 60s --csv load

(``benchmarks/load/run.py`` starts a whole stack, runs it and prints requests/s and p99.) An answer the API
documents as a refusal under load (409 not ready, 429 over a limit) counts as a success: it is the API holding
its limits; a 5xx or an unexpected status is a failure.
"""

from __future__ import annotations

import io
import os
import random

import requests
from locust import HttpUser, between, task
from PIL import Image, ImageDraw

EXPECTED = {200, 202, 409, 429}
_KEYS = [k for k in os.environ.get("PAPERLANE_LOAD_KEYS", "").split(",") if k]


def _page(n: int) -> bytes:
    img = Image.new("L", (620, 180), 250)
    ImageDraw.Draw(img).text((20, 60), f"Receipt {n} total {n % 97}.50", fill=0)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


class Tenant(HttpUser):
    """One tenant's client (keys dealt round-robin)."""

    wait_time = between(0.1, 0.5)
    _dealt = 0

    def on_start(self) -> None:
        if not _KEYS:
            raise RuntimeError("set PAPERLANE_LOAD_KEYS to the tenants' API keys, comma-separated")
        Tenant._dealt += 1
        self.client.headers["Authorization"] = f"Bearer {_KEYS[Tenant._dealt % len(_KEYS)]}"
        self.documents: list[str] = []

    def _check(self, name: str, method: str, url: str, **kwargs: object) -> object:
        with self.client.request(method, url, name=name, catch_response=True, **kwargs) as resp:
            if resp.status_code in EXPECTED:
                resp.success()
            else:
                resp.failure(f"{resp.status_code}: {resp.text[:200]}")
            return resp

    def _document(self) -> str | None:
        return random.choice(self.documents) if self.documents else None

    @task(2)
    def upload(self) -> None:
        resp = self._check("POST /v1/documents", "POST", "/v1/documents",
                           files={"file": ("r.png", _page(random.randrange(10**9)), "image/png")})
        if resp.status_code == 202:  # type: ignore[attr-defined]
            self.documents = [*self.documents[-20:], resp.json()["document_id"]]  # type: ignore[attr-defined]

    @task(6)
    def poll(self) -> None:
        if doc := self._document():
            self._check("GET /v1/documents/{id}", "GET", f"/v1/documents/{doc}")

    @task(1)
    def stream(self) -> None:
        if doc := self._document():
            with self.client.get(f"/v1/documents/{doc}/events", name="GET /v1/documents/{id}/events", stream=True,
                                 catch_response=True, timeout=10) as resp:
                if resp.status_code in EXPECTED:
                    try:
                        for _ in zip(range(3), resp.iter_lines()):  # its first events (or keepalives), then away
                            pass
                    except requests.RequestException:  # nothing within the timeout: a quiet stream, left
                        pass
                    resp.success()
                else:
                    resp.failure(str(resp.status_code))

    @task(3)
    def result(self) -> None:
        if doc := self._document():
            self._check("GET /v1/documents/{id}/result", "GET", f"/v1/documents/{doc}/result")

    @task(1)
    def build(self) -> None:
        if doc := self._document():
            fmt = random.choice(("alto", "hocr", "mets"))
            self._check("GET /v1/documents/{id}/result?format=xml", "GET", f"/v1/documents/{doc}/result",
                        params={"format": fmt})
