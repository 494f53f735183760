"""Engine answers kept in Redis for an hour, by job.

A worker that dies after the engine answered a page and before its result was stored (post-processing,
drawing, storing: a few hundred milliseconds per page, several pages at any moment) would send those pages
to the engine again on their next attempt: GPU time spent twice. The answer is kept here the moment it
arrives, and a retried page (attempt two on) takes it instead of a new engine call. Plain JSON, never
pickle (whoever can write to Redis must not run code in a worker); anything unreadable is ignored.
"""

from __future__ import annotations

import logging
from typing import Any

import pydantic
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
            self._redis.set(keys.answer(job_id), _Kept.of(output).model_dump_json(), ex=self._ttl)
        except (redis.RedisError, ValueError) as exc:  # ValueError: a value pydantic cannot write as JSON
            log.debug("answer of job %s not kept: %s", job_id, exc)

    def get(self, job_id: str) -> EngineOutput | None:
        try:
            raw = self._redis.get(keys.answer(job_id))
            return _Kept.model_validate_json(raw).output() if raw else None
        except (redis.RedisError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
            log.warning("kept answer of job %s not used: %s", job_id, exc)
            return None


class _Kept(pydantic.BaseModel):
    """An answer as kept: serialised and read back by pydantic in one call each (this runs in the process
    feeding the engine, once per page). The grade and the engine that read the page (a fallback) travel with
    the answer: a degenerate or fallback answer taken from here is flagged as it was when it came. ``quality``
    and ``engine`` may be absent (answers kept before they were added)."""

    text: str
    lines: list[Line]
    markdown: str | None
    fields: dict[str, Any] | None
    missing_fields: list[str]
    truncated: bool
    usage: Usage | None
    raw: str | None
    seconds: float | None
    quality: Quality | None = None
    engine: EngineInfo | None = None

    @classmethod
    def of(cls, o: EngineOutput) -> _Kept:
        return cls.model_construct(text=o.text, lines=o.lines, markdown=o.markdown, fields=o.fields,
                                   missing_fields=o.missing_fields, truncated=o.truncated, usage=o.usage, raw=o.raw,
                                   seconds=o.seconds, quality=o.quality, engine=o.engine)

    def output(self) -> EngineOutput:
        return EngineOutput(text=self.text, lines=self.lines, markdown=self.markdown, fields=self.fields,
                            missing_fields=self.missing_fields, truncated=self.truncated, usage=self.usage,
                            raw=self.raw, seconds=self.seconds, quality=self.quality, engine=self.engine)
