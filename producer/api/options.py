"""The options of an upload or an ingest, defined once: what to do with the pages, in which lane, whom to call."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from paperlane.errors import first_error
from paperlane.priority.lanes import LEVELS_PER_LANE, Lane, message_priority
from paperlane.producer.api.errors import ApiError
from paperlane.producer.webhooks import check_callback
from paperlane.schemas import Task, TaskSpec, Weight
from paperlane.settings import ApiSettings
from paperlane.storage.tenants import Caller


# An id this API gave (an ingest's, a document's, a page's): anything else answers 404, and a path holding a
# control character never gets here (the guard answers 404 for it).
Id = Annotated[str, Path(max_length=200, description="an id this API gave")]
_TEXT = "^[^\\x00-\\x1f\\x7f]*$"  # no control characters (the JSON Schema form of what the models check)


class Options(BaseModel):
    lane: Lane = Lane.BATCH
    task: Task = Task.SPOTTING
    fields: list[str] = Field(default_factory=list, description="fields task: the keys to extract")
    to: str = Field("English", description="translate task: the target language")
    priority: int = Field(0, ge=0, le=LEVELS_PER_LANE - 1, description="order within the lane, 0 (first) to 4")
    callback_url: str | None = Field(None, max_length=2000, description="POSTed (signed) when the ingest finishes")
    name: str | None = Field(None, max_length=200, pattern=_TEXT)
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
    """Register objects already in S3 as a batch ingest: ``source``, or ``bucket`` and ``keys``, or both."""

    model_config = ConfigDict(json_schema_extra={"anyOf": [
        {"required": ["source"], "properties": {"source": {"type": "string"}}},
        {"required": ["bucket", "keys"], "properties": {"bucket": {"type": "string"}, "keys": {"minItems": 1}}}]})

    source: str | None = Field(None, pattern="^s3://[a-z0-9][a-z0-9.-]{0,62}(/[^\\x00-\\x1f\\x7f]*)?$",
                               description="s3://bucket/prefix: every object under it")
    bucket: str | None = Field(None, pattern="^[a-z0-9][a-z0-9.-]{0,62}$",
                               description="with keys: the bucket of the listed objects")
    keys: list[Annotated[str, Field(min_length=1, max_length=1024, pattern=_TEXT)]] = Field(
        default_factory=list, max_length=10_000, description="object keys, each a document")

    @model_validator(mode="after")
    def _one_form(self) -> IngestRequest:
        if not (self.source or (self.bucket and self.keys)):
            raise ValueError("give source (s3://bucket/prefix), or bucket and keys")
        return self


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


def upload_form() -> dict[str, Any]:
    """The OpenAPI request body of an upload: the document in ``file`` and the options as form fields (``fields``
    comma-separated), described from ``Options`` itself."""
    schema = Options.model_json_schema(ref_template="#/components/schemas/{model}")  # Lane, Task: IngestRequest's
    fields = {name: {k: v for k, v in prop.items() if k != "default"} for name, prop in schema["properties"].items()}
    fields["fields"] = {"type": "string", "pattern": _TEXT, "description": "fields task: the keys, comma-separated"}
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
        "type": "object", "required": ["file"], "properties": {"file": {"type": "string", "format": "binary"},
                                                               **fields}}}}}}
