"""One attempt at one page, start to finish, for every runtime: ``AttemptRunner``.

The steps, in order, each in one place:

    claim        start the attempt under the job's row (``jobs.start_attempt``): None when there is nothing to
                 do (final already, or held by a live lease); a page whose workers keep dying fails here
    hold         the worker's lease keeper renews the lease while the attempt runs (``workers.leases``)
    prepare      fetch and prepare on the CPU pool      \
    infer        the engine, in a micro-batch            | ``pipeline.process_page``: never raises, every
    post-process boxes, reading order, clean-up (pool)   | failure becomes the page's failed outcome
    store        the objects (pool), then the rows      /  (``pipeline._finish``, ``workers.page_store``)
    settle       record the outcome by the retry policy (``settle``: done, retried, failed, handed back)
    outputs      the outputs of every document the attempt finished (``Outputs``: the worker's ``Writer``)

The Celery task (``workers.worker``) and ``paperlane run`` (``workers.embedded``) are thin adapters around it:
each turns what it was handed into a ``PageMessage``, runs it, and puts a retried page back where its runtime
keeps pages that wait (Redis's delayed set, or memory). Unknown exceptions are logged with their traceback and
stored as "internal error".

``settle`` applies the policy: a success is stored already; a failure is recorded as a retry (queued, the reason
kept for operators), as failed for good with its readable reason, or, for a page its stopping worker handed back,
as queued again without counting the attempt. The caller puts retried and handed-back pages back on their lane
after ``Decision.delay``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from paperlane.errors import PaperlaneError
from paperlane.metrics import PAGES, STAGE_SECONDS, reason_label
from paperlane.priority.messages import PageMessage
from paperlane.retry import Action, Decision, RetryPolicy
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database
from paperlane.storage.outputs import Claim
from paperlane.storage.results import Known
from paperlane.storage.usage import EngineWork
from paperlane.workers.pipeline import PageOutcome, Runtime, process_page

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settled:
    decision: Decision
    outputs_due: tuple[str, ...] = ()  # documents whose outputs the outcome made due
    held_until: datetime | None = None  # and claimed for this runtime's outputs, until then (``Runtime.claim_outputs``)


@dataclass(frozen=True)
class Attempt:
    """What an attempt did (``outcome``: the page's result, its timings, its annotated image) and what the retry
    policy says follows it (``settled``)."""

    outcome: PageOutcome
    settled: Settled

    @property
    def decision(self) -> Decision:
        return self.settled.decision


class Leases(Protocol):
    def hold(self, job_id: str) -> None:
        """Keep the lease of ``job_id`` alive until ``release``. Never raises."""
        ...

    def release(self, job_id: str) -> None:
        """Stop renewing the lease of ``job_id``. Never raises."""
        ...


class Outputs(Protocol):
    """The output step: where a finished document's outputs are built and stored. The seam for moving them off
    the process that feeds the engine."""

    def write(self, document_id: str, *, known: Known | None = None) -> object:
        """Write the document's outputs if they are due and nobody else holds them (``known``: results this process
        just stored, by job id). Failures are recorded for a retry, never raised."""
        ...

    def write_held(self, held: Claim, *, known: Known | None = None) -> object:
        """``write``, for outputs claimed already (``held``)."""
        ...


class AttemptRunner:
    """Runs attempts (see the module docstring) against one runtime, under one retry policy.

    ``worker``, ``lease``: the name the job row records and the lease its attempt holds (a worker's; ``paperlane
    run`` has none). ``crash_limit``: whether a page whose earlier attempts all died with their worker is failed
    once they are used up (a worker's; a crash in ``paperlane run`` stops the run where the user sees it, and an
    interrupted run must not count against the pages it was working on). ``leases`` keeps the lease alive while
    the attempt runs; ``outputs`` writes the documents an attempt finished (None: the caller does)."""

    def __init__(self, rt: Runtime, policy: RetryPolicy, *, worker: str | None = None, lease: float | None = None,
                 crash_limit: bool = True, leases: Leases | None = None, outputs: Outputs | None = None) -> None:
        self.rt, self.policy = rt, policy
        self.worker, self.lease, self.crash_limit = worker, lease, crash_limit
        self.leases, self.outputs = leases, outputs

    def run(self, page: PageMessage) -> Attempt | None:
        """One attempt at ``page``'s job, recorded and settled; None when it needed none (final already, or held
        by a live lease). Raises JobNotFound, and StorageUnavailable when the database cannot be reached (nothing
        about the page could be recorded)."""
        job = jobstore.start_attempt(self.rt.db, page.job_id, policy=self.policy if self.crash_limit else None,
                                     worker=self.worker, lease=self.lease)
        if job is None:
            log.info("job %s not started: final, or held under a live lease", page.job_id)
            return None
        if self.leases is not None:
            self.leases.hold(job.id)
        try:
            outcome = process_page(self.rt, job)
            settled = settle(self.rt.db, outcome, self.policy)
        finally:
            if self.leases is not None:
                self.leases.release(job.id)
        attempt = Attempt(outcome, settled)
        self._write_outputs(attempt)
        return attempt

    def _write_outputs(self, attempt: Attempt) -> None:
        if self.outputs is None:
            return
        done = attempt.decision.action is Action.DONE
        # What was just stored (the result, or its JSON) saves the writer reading it back.
        outcome = attempt.outcome
        kept = outcome.result if outcome.whole else outcome.stored_json
        stored: Known | None = {outcome.job.id: kept} if done and kept is not None else None
        held = attempt.settled.held_until
        for document_id in attempt.settled.outputs_due:
            if held is not None:  # claimed by the transaction that finished the document: 0 failed tries yet
                self.outputs.write_held(Claim(document_id, held, 0), known=stored)
            else:
                self.outputs.write(document_id, known=stored)


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
        return Settled(decision, tuple(outcome.outputs_due), outcome.outputs_held)
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
