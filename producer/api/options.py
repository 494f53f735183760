"""The options of an upload or an ingest, defined once: what to do with the pages, in which lane, whom to call."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator

from paperlane.errors import first_error
from paperlane.priority.lanes import LEVELS_PER_LANE, Lane, message_priority
from paperlane.producer.api.errors import ApiError
from paperlane.producer.webhooks import check_callback
from paperlane.schemas import Task, TaskSpec, Weight
from paperlane.settings import ApiSettings
from paperlane.storage.tenants import Caller


class Options(BaseModel):
    lane: Lane = Lane.BATCH
    task: Task = Task.SPOTTING
    fields: list[str] = Field(default_factory=list, description="fields task: the keys to extract")
    to: str = Field("English", description="translate task: the target language")
    priority: int = Field(0, ge=0, le=LEVELS_PER_LANE - 1, description="order within the lane, 0 (first) to 4")
    callback_url: str | None = Field(None, description="POSTed (signed) when the ingest finishes")
    name: str | None = Field(None, max_length=200)
    weight: Weight = Field(1.0, description="the ingest's share of its tenant's turns "
                          "beside the tenant's other ingests (fair share within the lane)")

    @field_validator("fields", "to", "name", mode="after")  # a callback URL is checked as one (400)
    @classmethod
    def _printable(cls, value: Any) -> Any:
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str) and any(not c.isprintable() for c in text):
                raise ValueError("no control characters")
        return value

    def spec(self) -> TaskSpec:
        return TaskSpec(task=self.task, fields=tuple(self.fields), target_language=self.to)


class IngestRequest(Options):
    """Register objects already in S3 as a batch ingest."""

    source: str | None = Field(None, description="s3://bucket/prefix: every object under it")
    bucket: str | None = Field(None, description="with keys: the bucket of the listed objects")
    keys: list[str] = Field(default_factory=list, max_length=10_000, description="object keys, each a document")


def checked(options: Options | dict[str, Any], who: Caller, api: ApiSettings) -> tuple[Options, TaskSpec]:
    """``options`` validated for ``who``: 422 when they do not validate, 403 for a lane (a message priority) its key
    may not use, 400 for a callback URL that may not be called. Resolves the callback's host: call it off the event
    loop."""
    try:
        opts = options if isinstance(options, Options) else Options.model_validate(options)
        spec = opts.spec()
    except (ValidationError, ValueError) as exc:
        raise ApiError(422, "invalid_request", first_error(exc)) from None
    if not who.interactive and message_priority(opts.lane, opts.priority) < Lane.BATCH.base_priority:
        raise ApiError(403, "lane_forbidden", "this key may not use the interactive lane")
    if opts.callback_url:
        check_callback(opts.callback_url, api)
    return opts, spec
