"""The dead-letter list: lane messages no worker could take, set aside for operators instead of lost.

A message that is not a page message (``priority.messages``) or names no job is logged and pushed
here with why, the queue it came from and when; the worker goes on with the next one. One Redis
list (``keys.DEAD_LETTERS``), newest first, trimmed to the newest ``KEEP`` entries, each
entry one JSON object holding the message as it was on the queue (cut at ``MAX_MESSAGE_BYTES``).
``paperlane dead-letters`` lists them and can purge them.
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

import redis

from paperlane.errors import StorageUnavailable
from paperlane.priority import keys

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024
KEEP = 1000  # entries kept, the newest


@dataclass(frozen=True)
class DeadLetter:
    at: str  # when it was set aside, UTC, ISO 8601
    queue: str | None  # the lane queue it was taken from
    reason: str
    message: str  # the message as it was on the queue; base64 when it was not UTF-8 text
    encoding: str = "utf-8"  # "utf-8" or "base64"
    size: int = 0  # bytes of the whole message
    truncated: bool = False  # only its first MAX_MESSAGE_BYTES are kept

    @classmethod
    def of(cls, raw: bytes | str, *, reason: str, queue: str | None) -> DeadLetter:
        data = raw.encode() if isinstance(raw, str) else raw
        kept = data[:MAX_MESSAGE_BYTES]
        try:
            message, encoding = kept.decode(), "utf-8"
        except UnicodeDecodeError:
            message, encoding = base64.b64encode(kept).decode(), "base64"
        return cls(at=datetime.now(UTC).isoformat(timespec="milliseconds"), queue=queue, reason=reason,
                   message=message, encoding=encoding, size=len(data), truncated=len(data) > len(kept))

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, entry: bytes | str) -> DeadLetter:
        """An entry of the list; one that is not ours is shown as it is, with a reason saying so."""
        try:
            return cls(**json.loads(entry))
        except (ValueError, TypeError):
            return cls.of(entry, reason="not a dead-letter entry", queue=None)


class DeadLetters:
    """The dead-letter list in Redis."""

    def __init__(self, client: redis.Redis, *, keep: int = KEEP) -> None:
        self._redis = client
        self._keep = keep

    def add(self, raw: bytes | str, *, reason: str, queue: str | None) -> bool:
        """Set ``raw`` aside with ``reason``; whether it was kept. Never raises: a broker that cannot take
        it gets the message into the log instead (the worker goes on either way)."""
        letter = DeadLetter.of(raw, reason=reason, queue=queue)
        log.error("message on %s set aside in %s: %s", queue or "?", keys.DEAD_LETTERS, reason)
        try:
            pipe = self._redis.pipeline(transaction=True)
            pipe.lpush(keys.DEAD_LETTERS, letter.to_json())
            pipe.ltrim(keys.DEAD_LETTERS, 0, self._keep - 1)
            pipe.execute()
            return True
        except redis.RedisError as exc:
            log.error("dead letter not kept (%s); the message was: %.2000s", exc, letter.message)
            return False

    def recent(self, limit: int | None = None) -> list[DeadLetter]:
        """The entries, newest first (at most ``limit``). Raises StorageUnavailable."""
        try:
            entries = self._redis.lrange(keys.DEAD_LETTERS, 0, -1 if limit is None else limit - 1)
        except redis.RedisError as exc:
            raise StorageUnavailable(f"broker unreachable: {exc}") from exc
        return [DeadLetter.from_json(e) for e in entries]

    def purge(self) -> list[DeadLetter]:
        """Empty the list at once; the entries it held, newest first. Raises StorageUnavailable."""
        try:
            pipe = self._redis.pipeline(transaction=True)
            pipe.lrange(keys.DEAD_LETTERS, 0, -1)
            pipe.delete(keys.DEAD_LETTERS)
            entries, _ = pipe.execute()
        except redis.RedisError as exc:
            raise StorageUnavailable(f"broker unreachable: {exc}") from exc
        return [DeadLetter.from_json(e) for e in entries]
