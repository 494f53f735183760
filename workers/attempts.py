"""The retry policy around one attempt: after a page's outcome, retry it, fail it, or it is done.

Kept apart from the attempt itself (``workers.pipeline``) so the Celery task and the embedded
runner apply the same rules: a retryable error (engine or storage unreachable) is tried again
with exponential backoff up to ``max_attempts``; anything else fails the page at once with its
readable reason. Unknown exceptions are logged with their traceback and stored as "internal error".
A page cut short because its worker is stopping is handed back: queued again, the attempt not counted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum

from paperlane.errors import PaperlaneError, WorkerStopping, is_retryable, public_reason
from paperlane.metrics import PAGES, STAGE_SECONDS, reason_label
from paperlane.settings import WorkerSettings
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database
from paperlane.workers.pipeline import PageOutcome

log = logging.getLogger(__name__)


class Action(str, Enum):
    DONE = "done"  # succeeded and stored
    RETRY = "retry"  # try again after ``delay`` (the caller puts the page back on its lane then)
    FAILED = "failed"  # failed for good, the reason recorded
    HANDED_BACK = "handed_back"  # its worker is stopping: queued, the attempt not counted (caller: back on its lane)


@dataclass(frozen=True)
class Decision:
    action: Action
    delay: float = 0.0
    reason: str | None = None
    finished_documents: tuple[str, ...] = ()  # documents whose last page this was: their outputs are due


def settle(db: Database, outcome: PageOutcome, cfg: WorkerSettings) -> Decision:
    """Record the outcome of an attempt and say what happens next."""
    decision = _settle(db, outcome, cfg)
    PAGES.labels(decision.action.value, reason_label(decision.reason)).inc()
    if decision.action in (Action.DONE, Action.FAILED):
        for stage, seconds in outcome.timings.items():
            STAGE_SECONDS.labels(stage).observe(seconds)
    return decision


def _settle(db: Database, outcome: PageOutcome, cfg: WorkerSettings) -> Decision:
    job = outcome.job
    if outcome.error is None:
        log.info("job %s succeeded attempt=%d %s", job.id, job.attempts, _fmt(outcome.timings))
        return Decision(Action.DONE, finished_documents=tuple(outcome.finished_documents))
    exc = outcome.error
    reason = public_reason(exc)
    if isinstance(exc, WorkerStopping):
        jobstore.hand_back(db, job.id)
        log.info("job %s handed back to its lane: %s", job.id, reason)
        return Decision(Action.HANDED_BACK, reason=reason)
    stage = getattr(exc, "stage", None)
    if not isinstance(exc, PaperlaneError):
        log.error("job %s: unexpected error", job.id, exc_info=exc)
    if is_retryable(exc) and job.attempts < cfg.max_attempts:
        delay = cfg.retry_backoff * 2 ** (job.attempts - 1)
        jobstore.record_retry(db, job.id, reason, stage)
        log.warning("job %s attempt %d failed (%s); retry in %.1fs", job.id, job.attempts, reason, delay)
        return Decision(Action.RETRY, delay, reason)
    finished = jobstore.finish_failed(db, job.id, reason, stage, outcome.timings)
    log.warning("job %s failed at %s: %s", job.id, stage or "?", reason)
    return Decision(Action.FAILED, reason=reason, finished_documents=tuple(finished))


def _fmt(timings: dict[str, float]) -> str:
    return " ".join(f"{k}={v * 1000:.0f}ms" for k, v in timings.items())
