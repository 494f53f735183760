"""The retry policy: what is tried again, after how long, how many times, and what a page that runs out says.

One policy for every way a page goes back to its lane:

- an attempt that failed in a way a later try may fix (``PaperlaneError.retryable``: the engine or a store
  unreachable, memory short) is tried again after ``backoff`` seconds, doubling each time, until
  ``max_attempts``; anything else fails the page at once with its readable reason;
- an attempt cut short because its worker is stopping (``WorkerStopping``) is handed back: queued again at once,
  the attempt not counted;
- an attempt whose worker died or hung (its lease ran out, or its message came back with the job still running)
  counts as an attempt; once they are used up the page fails with ``lost_worker_reason``;
- a message nothing could be recorded for (the database that counts attempts is down) waits twice as long as a
  page's last retry would (``unrecorded_delay``) and comes back without counting an attempt.

The attempt runner (``workers.attempts``, for the Celery task and ``paperlane run``), the lease keeper, the job
store (which fails a page whose attempts all died with their worker), the document outputs and the webhook
deliveries (``storage.webhooks``: ``delay`` and ``exhausted``) all ask this one object.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from paperlane.errors import PaperlaneError, WorkerStopping, public_reason
from paperlane.settings import WorkerSettings
from paperlane.status import JobStatus


class Action(str, Enum):
    """What happens to a page after an attempt (also the outcome label of ``paperlane_pages_total``)."""

    DONE = "done"  # succeeded and stored
    RETRY = "retry"  # back on its lane after ``Decision.delay``, the attempt counted
    FAILED = JobStatus.FAILED.value  # failed for good, the reason recorded
    HANDED_BACK = "handed_back"  # its worker is stopping: back on its lane now, the attempt not counted


@dataclass(frozen=True)
class Decision:
    action: Action
    delay: float = 0.0
    reason: str | None = None  # the public, one-line reason of a failed attempt


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3
    backoff: float = 2.0  # seconds before the first retry; doubles with each attempt

    @classmethod
    def of(cls, cfg: WorkerSettings) -> RetryPolicy:
        return cls(max_attempts=cfg.max_attempts, backoff=cfg.retry_backoff)

    def retryable(self, exc: BaseException) -> bool:
        """Whether trying the same page again may succeed."""
        return isinstance(exc, PaperlaneError) and exc.retryable

    def delay(self, attempt: int) -> float:
        """Seconds before the try that follows attempt number ``attempt`` (from 1)."""
        return self.backoff * 2 ** max(0, attempt - 1)

    def unrecorded_delay(self) -> float:
        """Seconds a message waits when nothing about it could be recorded (the database is down): twice as long
        as the last retry of a page waits (``delay(max_attempts - 1)``: the wait the doubling would give next), or
        ``backoff`` when a page has no retry (``max_attempts`` 1)."""
        return self.delay(self.max_attempts)

    def exhausted(self, attempts: int) -> bool:
        """Whether a page that has had ``attempts`` attempts may have no more."""
        return attempts >= self.max_attempts

    def decide(self, error: BaseException | None, *, attempts: int) -> Decision:
        """What follows attempt number ``attempts`` that ended with ``error`` (None: it succeeded)."""
        if error is None:
            return Decision(Action.DONE)
        reason = public_reason(error)
        if isinstance(error, WorkerStopping):
            return Decision(Action.HANDED_BACK, reason=reason)
        if self.retryable(error) and not self.exhausted(attempts):
            return Decision(Action.RETRY, self.delay(attempts), reason)
        return Decision(Action.FAILED, reason=reason)

    @staticmethod
    def lost_worker_reason(attempts: int, worker: str | None) -> str:
        """Why a page fails whose every attempt ended with its worker dying or hanging."""
        return (f"its worker ({worker or 'unknown'}) stopped answering {attempts} times; giving up on this page "
                "(it may crash or hang workers)")


LOST_WORKER_STAGE = "worker"  # the stage a page failed at when its workers kept dying on it
