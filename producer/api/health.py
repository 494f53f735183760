"""The process's health (/healthz, answered on the event loop: no thread, no service), its readiness (/readyz:
the database, Redis and the object store answer) and its metrics (/metrics, with the lanes' backlog); the last
two need ``api.metrics_token`` when one is set (the guard checks it)."""

from __future__ import annotations

import logging
from functools import partial

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from sqlalchemy import text

from paperlane.priority.depth import QueueDepth
from paperlane.producer.api.service import ServiceDep
from paperlane.storage.db import Database

log = logging.getLogger(__name__)

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
def metrics(svc: ServiceDep) -> Response:
    """This process's series and the lanes' backlog (read from Redis now: autoscaling's signal, served here too
    so that workers scaled to zero are woken by it)."""
    depth = CollectorRegistry(auto_describe=False)
    depth.register(QueueDepth(svc.redis))
    return Response(generate_latest() + generate_latest(depth), media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz", tags=["health"])
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz", tags=["health"])
def readyz(svc: ServiceDep) -> JSONResponse:
    """The database, Redis and the object store answer."""
    checks: dict[str, str] = {}
    for name, check in (("database", partial(_db_ready, svc.db)), ("redis", svc.redis.ping),
                        ("objects", partial(svc.store.exists, "readyz"))):
        try:
            check()
            checks[name] = "ok"
        except Exception as exc:
            log.warning("readyz: %s: %s", name, exc)
            checks[name] = "unreachable"
    ok = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ok" if ok else "unavailable", "checks": checks}, status_code=200 if ok else 503)


def _db_ready(db: Database) -> None:
    with db.session() as s:
        s.execute(text("SELECT 1"))
