"""The API app: its routers by resource, its error handlers and request metrics, and this process's webhook
dispatcher; ``serve`` runs it with uvicorn (``paperlane api``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from anyio import to_thread
from fastapi import FastAPI, Request
from fastapi.responses import Response

from paperlane.metrics import API_REQUESTS, API_SECONDS
from paperlane.producer.api import documents, errors, health, ingests, pages, usage, web
from paperlane.producer.api.builds import Draw
from paperlane.producer.api.guard import Guard
from paperlane.producer.api.service import Service
from paperlane.producer.api.turns import Gate, Turns
from paperlane.producer.webhooks import Dispatcher
from paperlane.settings import Settings


def create_app(settings: Settings, *, webhooks: bool = True, draw: Draw | None = None) -> FastAPI:
    """The API app. ``webhooks``: run this process's webhook dispatcher; ``draw``: what draws a page's annotated image
    when it is first asked for (``workers.drawing.drawn_on_request``; none: only those the workers drew are
    served)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = Service.open(settings, draw=draw)
        await to_thread.run_sync(service.db.upgrade)
        app.state.service = service
        app.state.turns = Gate.of(settings.api)
        dispatcher = Dispatcher(service.db, settings.api) if webhooks else None
        task = asyncio.create_task(dispatcher.run()) if dispatcher else None
        try:
            yield
        finally:
            if dispatcher and task:
                dispatcher.stop()
                await task
            await service.stop()
            service.close()

    app = FastAPI(title="paperlane", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  responses=errors.ERRORS,
                  description="Scanned documents to structured text: upload, wait, stream page results.")
    errors.install(app)
    app.add_middleware(Guard)  # inside the measuring middleware: its refusals are counted too
    app.add_middleware(Turns)  # outside the guard: a request waits for its turn before its key is looked up
    _measure(app)
    for module in (health, web, documents, ingests, pages, usage):
        app.include_router(module.router)
    return app


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_STATUSES = frozenset({200, 202, 204, 304, 400, 401, 403, 404, 405, 409, 413, 415, 422, 429, 500, 503})


def _measure(app: FastAPI) -> None:
    @app.middleware("http")
    async def measure(request: Request, call_next: Callable[[Request], Any]) -> Response:
        started = time.perf_counter()
        response: Response = await call_next(request)
        # Labels from the route's template and fixed sets only: nothing a client sends makes a new series.
        route = getattr(request.scope.get("route"), "path", "unmatched")
        method = request.method if request.method in _METHODS else "other"
        status = str(response.status_code) if response.status_code in _STATUSES else f"{response.status_code // 100}xx"
        API_SECONDS.labels(method, route).observe(time.perf_counter() - started)
        API_REQUESTS.labels(method, route, status).inc()
        return response


def serve(settings: Settings, *, host: str, port: int, draw: Draw | None = None) -> None:
    """Run the API with uvicorn (``paperlane api``)."""
    import uvicorn

    uvicorn.run(create_app(settings, draw=draw), host=host, port=port, log_level=settings.log_level.lower(),
                proxy_headers=True, forwarded_allow_ips=settings.api.trusted_proxies, server_header=False)
