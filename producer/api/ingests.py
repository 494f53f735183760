"""/v1/ingests: register objects already in S3 as an ingest; an ingest's status."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Annotated, Any

from anyio import to_thread
from fastapi import APIRouter, Query

from paperlane.errors import public_reason
from paperlane.producer import inputs
from paperlane.producer.api.documents import wait_for_change
from paperlane.producer.api.errors import ApiError
from paperlane.producer.api.options import IngestRequest, checked
from paperlane.producer.api.service import CallerDep, Service, ServiceDep, check_room
from paperlane.producer.submit import Submitter
from paperlane.status import RollupState
from paperlane.storage import ingests, views

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/ingests", tags=["ingests"])


@router.post("", status_code=202)
async def post_ingest(req: IngestRequest, svc: ServiceDep, who: CallerDep) -> dict[str, Any]:
    """Register an s3:// prefix (or a list of keys) as an ingest; registration goes on after the answer."""
    opts, spec = await to_thread.run_sync(checked, req, who, svc.settings.api)  # resolves the callback host
    sources = _sources(req, svc)
    await to_thread.run_sync(check_room, svc, who)
    submitter = Submitter(db=svc.db, store=svc.store, spec=spec, lane=opts.lane, priority=opts.priority,
                          publisher=svc.publisher, limits=svc.settings.ingest, resume=False,
                          owner=ingests.Owner(who.tenant_id, who.key_id, opts.callback_url))
    name = opts.name or ", ".join(sources)[:200]
    ingest_id = await to_thread.run_sync(lambda: submitter.open(name=name, sources=[*sources, str(uuid.uuid4())]))
    task = asyncio.get_running_loop().run_in_executor(None, _register, svc, submitter, sources, name)
    svc.registering.add(task)
    task.add_done_callback(svc.registering.discard)
    return {"ingest_id": ingest_id, "status": RollupState.REGISTERING.value}


@router.get("/{ingest_id}")
async def get_ingest(ingest_id: str, svc: ServiceDep, who: CallerDep,
                     wait: Annotated[float, Query(ge=0)] = 0) -> dict[str, Any]:
    """An ingest's progress; ``wait``: hold the answer until it changes (seconds, at most api.max_wait)."""

    def read() -> dict[str, Any]:
        return views.ingest_view(*ingests.ingest_progress(svc.db, ingest_id, tenant_id=who.tenant_id))
    return await wait_for_change(read, wait, svc.settings.api.max_wait)


def _sources(req: IngestRequest, svc: Service) -> list[str]:
    if req.source:
        if not req.source.startswith("s3://") or req.keys:
            raise ApiError(422, "invalid_request", "give source as s3://bucket/prefix, or bucket and keys")
        sources = [req.source]
    elif req.bucket and req.keys:
        sources = [f"s3://{req.bucket}/{k.lstrip('/')}" for k in req.keys]
    else:
        raise ApiError(422, "invalid_request", "give source (s3://bucket/prefix) or bucket and keys")
    for s in sources:
        inputs.check_paths([s])
        if s[5:].partition("/")[0] not in svc.settings.api.ingest_buckets:
            raise ApiError(403, "bucket_forbidden", f"ingests may not read the bucket {s[5:].partition('/')[0]}")
    return sources


def _register(svc: Service, submitter: Submitter, sources: list[str], name: str) -> None:
    """Register a whole S3 ingest (in a thread: a prefix may hold millions of objects)."""
    from paperlane.storage.s3 import S3Store

    try:
        client = S3Store.from_settings(svc.settings.storage.model_copy(update={"create_bucket": False})).client
        items = inputs.expand(sources, svc.settings.ingest, s3=client)
        for _ in submitter.submit(items, name=name, sources=sources):
            pass
    except Exception as exc:
        log.error("ingest %s: registration stopped (%s)", submitter.summary.ingest_id, public_reason(exc),
                  exc_info=exc)
