"""What a message on a lane queue must be: one page's Celery message, as ``broker.send_page`` writes it.

Workers check every message they pop off a lane (``priority.transport``) before kombu and Celery
read it: kombu ends the worker on a message that is not JSON or not shaped like a kombu message
(the consumer loop raises), and Celery only logs and drops an unknown task, a body it cannot decode
or arguments the task does not take. A message that fails the check is set aside in the dead-letter
list (``priority.deadletter``) with the reason this module gives, and the worker goes on.

The check accepts exactly what paperlane publishes in the fields kombu and Celery read before the
task runs (envelope, properties, the headers they interpret, the body): one job id, as the only
positional argument or as ``job_id``; and, when present, the page's fair share (``priority.fair``: tenant,
ingest, weights), whose names become parts of Redis keys. Whether that job exists is the task's to find out.

``PageMessage`` is what such a message means: one page on its way to a worker, the one shape it has from its
registration (``producer.submit``) through the lanes and the delayed set (``priority.delayed``) to the task that
attempts it (``workers.worker``), published by the one ``broker.PagePublisher``.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from paperlane.errors import first_error
from paperlane.priority import fair
from paperlane.priority.lanes import PRIORITY_STEPS, TASK_PROCESS_PAGE, Lane
from paperlane.schemas import Weight


class PageMessage(BaseModel):
    """One page on its way to a worker: its job, the lane and message priority it waits at, and whose it is."""

    model_config = ConfigDict(frozen=True)

    job_id: str = Field(min_length=1, max_length=64)
    lane: Lane
    message_priority: int = Field(ge=PRIORITY_STEPS[0], le=PRIORITY_STEPS[-1])
    share: fair.Share | None = None  # None: the default share (the command line's)

    @classmethod
    def received(cls, job_id: str, *, queue: str | None, priority: int | None,
                 headers: dict[str, Any]) -> PageMessage:
        """The message a task was handed: its routing key names the lane (batch for any other), a missing
        priority is the lane's first, and a share the headers do not give (or give wrong) is None."""
        lane = Lane.of_queue(queue) or Lane.BATCH
        try:
            share = page_share(headers) if headers.get(fair.HEADER) is not None else None
        except BadMessage:
            share = None
        return cls(job_id=job_id, lane=lane, message_priority=lane.base_priority if priority is None else priority,
                   share=share)

    def member(self) -> str:
        """The message as one member of the delayed set: words without spaces (ids are checked to have none)."""
        share = self.share.words() if self.share is not None else []
        return " ".join([self.job_id, self.lane.value, str(self.message_priority), *share])

    @classmethod
    def parse(cls, member: str | bytes) -> PageMessage:
        """A member as ``member`` writes it (or without a share, as pages delayed before fair share were)."""
        job_id, lane, priority, *share = (member.decode() if isinstance(member, bytes) else member).split(" ")
        return cls(job_id=job_id, lane=Lane(lane), message_priority=int(priority),
                   share=fair.Share.of_words(share) if share else None)


# A page message's job id again, in a header of its own: the transport marks the page present as it publishes it
# (``priority.presence``) without parsing the message it was just handed. Workers read the body's, checked.
JOB_HEADER = "paperlane_job"


class BadMessage(ValueError):
    """A lane message no worker can take; ``reason`` says why in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class _DeliveryInfo(_Strict):
    exchange: str
    routing_key: str


class _Properties(_Strict):
    delivery_tag: str
    body_encoding: Literal["base64"]
    delivery_info: _DeliveryInfo
    priority: int | None = Field(None, ge=PRIORITY_STEPS[0], le=PRIORITY_STEPS[-1])


_NAME = r"^[A-Za-z0-9_-]{1,64}$"  # ids, uuids, or "-": nothing that could reach outside its key


class _Share(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(pattern=_NAME)
    ingest: str = Field(pattern=_NAME)
    tenant_weight: Weight = 1.0
    ingest_weight: Weight = 1.0


class _Headers(_Strict):
    task: str
    id: str
    share: _Share | None = Field(None, alias=fair.HEADER)
    # Celery holds a message with an ETA in the worker, outside the lanes and the prefetch limit;
    # paperlane's retries wait in Redis instead (priority.delayed), so a page message never has one.
    eta: None = None
    expires: None = None
    retries: int = 0
    timelimit: tuple[float | None, float | None] | None = None


class _Envelope(_Strict):
    body: str
    content_type: Literal["application/json"] = Field(alias="content-type")
    content_encoding: Literal["utf-8"] = Field(alias="content-encoding")
    headers: _Headers
    properties: _Properties


class _Embed(_Strict):
    callbacks: None = None
    errbacks: None = None
    chain: None = None
    chord: None = None


# Celery's body: [args, kwargs, embed].
_BODY = TypeAdapter(tuple[list[Any], dict[str, Any], _Embed | None], config=ConfigDict(strict=True))


def page_job_id(raw: bytes) -> str:
    """The job id a page message carries. Raises BadMessage saying what is wrong with ``raw``."""
    try:
        envelope = _Envelope.model_validate_json(raw)
    except ValidationError as exc:
        raise BadMessage(first_error(exc, what="message")) from exc
    if envelope.headers.task != TASK_PROCESS_PAGE:
        raise BadMessage(f"unknown task {envelope.headers.task[:100]!r}")
    try:
        body = base64.b64decode(envelope.body, validate=True)
    except binascii.Error as exc:
        raise BadMessage(f"body: not base64 ({exc})") from exc
    try:
        args, kwargs, _ = _BODY.validate_json(body)
    except ValidationError as exc:
        raise BadMessage(first_error(exc, what="body [args, kwargs, embed]")) from exc
    return _job_id(args, kwargs)


def page_share(headers: dict[str, Any]) -> fair.Share:
    """The fair share a message's headers give (the default share when they give none). Raises BadMessage."""
    value = headers.get(fair.HEADER)
    if value is None:
        return fair.Share()
    try:
        share = _Share.model_validate(value)
    except ValidationError as exc:
        raise BadMessage(first_error(exc, what=f"headers.{fair.HEADER}")) from exc
    return fair.Share(share.tenant, share.ingest, share.tenant_weight, share.ingest_weight)


def _job_id(args: list[Any], kwargs: dict[str, Any]) -> str:
    if len(args) == 1 and not kwargs:
        job_id = args[0]
    elif not args and kwargs.keys() == {"job_id"}:
        job_id = kwargs["job_id"]
    else:
        raise BadMessage(f"arguments: expected one job id, got args={_short(args)} kwargs={_short(kwargs)}")
    if not isinstance(job_id, str) or not 0 < len(job_id) <= 64:
        raise BadMessage(f"arguments: the job id must be a string of 1 to 64 characters, got {_short(job_id)}")
    return job_id


def _short(value: object, limit: int = 80) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= limit else text[: limit - 3] + "..."
