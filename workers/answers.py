"""Engine answers kept in Redis for an hour, by job.

A worker that dies after the engine answered a page and before its result was stored (post-processing,
drawing, storing: a few hundred milliseconds per page, several pages at any moment) would send those pages
to the engine again on their next attempt: GPU time spent twice. The answer is kept here the moment it
arrives, and a retried page (attempt two on) takes it instead of a new engine call. Plain JSON, never
pickle (whoever can write to Redis must not run code in a worker); anything unreadable is ignored.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis

from paperlane.models.engine import EngineOutput
from paperlane.priority import keys
from paperlane.schemas import EngineInfo, Line, Quality, Usage

log = logging.getLogger(__name__)

class EngineAnswers:
    def __init__(self, client: redis.Redis, *, ttl: int = 3600) -> None:
        self._redis = client
        self._ttl = ttl

    def put(self, job_id: str, output: EngineOutput) -> None:
        """Keep the answer (a failure only costs the engine call it would have saved)."""
        try:
            self._redis.set(keys.answer(job_id), json.dumps(_dump(output)), ex=self._ttl)
        except redis.RedisError as exc:
            log.debug("answer of job %s not kept: %s", job_id, exc)

    def get(self, job_id: str) -> EngineOutput | None:
        try:
            raw = self._redis.get(keys.answer(job_id))
            return _load(json.loads(raw)) if raw else None
        except (redis.RedisError, ValueError, TypeError, KeyError) as exc:
            log.warning("kept answer of job %s not used: %s", job_id, exc)
            return None


def _dump(o: EngineOutput) -> dict[str, Any]:
    # The grade and the engine that read the page (a fallback) travel with the answer: a degenerate or
    # fallback answer taken from here is flagged as it was when it came.
    return {"text": o.text, "lines": [line.model_dump(mode="json") for line in o.lines], "markdown": o.markdown,
            "fields": o.fields, "missing_fields": o.missing_fields, "truncated": o.truncated,
            "usage": o.usage.model_dump() if o.usage else None, "raw": o.raw, "seconds": o.seconds,
            "quality": o.quality.model_dump(mode="json") if o.quality else None,
            "engine": o.engine.model_dump(mode="json") if o.engine else None}


def _load(d: dict[str, Any]) -> EngineOutput:
    quality, engine = d.get("quality"), d.get("engine")  # absent from answers kept before they were added
    return EngineOutput(text=str(d["text"]), lines=[Line.model_validate(x) for x in d["lines"]],
                        markdown=d["markdown"], fields=d["fields"], missing_fields=list(d["missing_fields"]),
                        truncated=bool(d["truncated"]), usage=Usage.model_validate(d["usage"]) if d["usage"] else None,
                        raw=d["raw"], seconds=d["seconds"],
                        quality=Quality.model_validate(quality) if quality else None,
                        engine=EngineInfo.model_validate(engine) if engine else None)
