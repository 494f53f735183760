"""After an attempt: its outcome recorded, and what the retry policy says follows (``paperlane.retry``).

Kept apart from the attempt itself (``workers.pipeline``) so the Celery worker and ``paperlane run`` apply the
same rules the same way: a success is stored already; a failure is recorded as a retry (queued, the reason kept
for operators), as failed for good with its readable reason, or, for a page its stopping worker handed back, as
queued again without counting the attempt. Unknown exceptions are logged with their traceback and stored as
"internal error". The caller puts retried and handed-back pages back on their lane after ``Decision.delay``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from paperlane.errors import PaperlaneError
from paperlane.metrics import PAGES, STAGE_SECONDS, reason_label
from paperlane.retry import Action, Decision, RetryPolicy
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database
from paperlane.storage.usage import EngineWork
from paperlane.workers.pipeline import PageOutcome

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settled:
    decision: Decision
    outputs_due: tuple[str, ...] = ()  # documents whose outputs the outcome made due


def settle(db: Database, outcome: PageOutcome, policy: RetryPolicy) -> Settled:
    """Record the outcome of an attempt; what follows it."""
    settled = _settle(db, outcome, policy)
    decision = settled.decision
    PAGES.labels(decision.action.value, reason_label(decision.reason)).inc()
    if decision.action in (Action.DONE, Action.FAILED):
        for stage, seconds in outcome.timings.items():
            STAGE_SECONDS.labels(stage).observe(seconds)
    return settled


def _settle(db: Database, outcome: PageOutcome, policy: RetryPolicy) -> Settled:
    job, error = outcome.job, outcome.error
    decision = policy.decide(error, attempts=job.attempts)
    if decision.action is Action.DONE:
        log.info("job %s succeeded attempt=%d %s", job.id, job.attempts, _fmt(outcome.timings))
        return Settled(decision, tuple(outcome.outputs_due))
    assert error is not None and decision.reason is not None
    if decision.action is Action.HANDED_BACK:
        jobstore.hand_back(db, job.id)
        log.info("job %s handed back to its lane: %s", job.id, decision.reason)
        return Settled(decision)
    stage = getattr(error, "stage", None)
    if not isinstance(error, PaperlaneError):
        log.error("job %s: unexpected error", job.id, exc_info=error)
    if decision.action is Action.RETRY:
        jobstore.record_retry(db, job.id, decision.reason, stage)
        log.warning("job %s attempt %d failed (%s); retry in %.1fs", job.id, job.attempts, decision.reason,
                    decision.delay)
        return Settled(decision)
    finished = jobstore.finish_failed(db, job.id, decision.reason, stage, outcome.timings,
                                      work=EngineWork.of(outcome.result, outcome.timings))
    log.warning("job %s failed at %s: %s", job.id, stage or "?", decision.reason)
    return Settled(decision, tuple(finished))


def _fmt(timings: dict[str, float]) -> str:
    return " ".join(f"{k}={v * 1000:.0f}ms" for k, v in timings.items())
