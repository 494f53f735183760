"""The states of pages, documents, ingests and document outputs, and how they roll up: paperlane's one vocabulary.

    job (the work behind a page)   queued -> running -> succeeded | failed
    page                           a job's state, or ``unpublished``: queued, its message never handed to the broker
    document                       from its pages: queued | running | succeeded | failed | partial
    ingest                         ``registering`` until every document is registered, then as a document,
                                   from all its pages
    outputs (of a document)        pending | written | failed, once its last page is final

A document or ingest is ``queued`` while none of its pages has started or finished, ``running`` while some have
and not all are final, and once all are final ``succeeded`` (none failed), ``failed`` (none succeeded) or
``partial``. The CLI, the HTTP API, webhooks and the SQL views (``page_status``, ``document_status``,
``ingest_status``, built from the expressions below) all say it this way; nothing else spells a state.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class JobStatus(str, Enum):
    """The state a job row is in (the ``jobs.status`` column)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED)


class PageState(str, Enum):
    """What a page shows: its job's state, or ``unpublished`` for a queued job whose message never went out."""

    QUEUED = JobStatus.QUEUED.value
    UNPUBLISHED = "unpublished"
    RUNNING = JobStatus.RUNNING.value
    SUCCEEDED = JobStatus.SUCCEEDED.value
    FAILED = JobStatus.FAILED.value

    @classmethod
    def of(cls, status: JobStatus | str, *, published: bool) -> PageState:
        """The state shown for a job in ``status`` whose message went out (``published``) or not."""
        status = JobStatus(status)
        if status is JobStatus.QUEUED and not published:
            return cls.UNPUBLISHED
        return cls(status.value)

    @property
    def final(self) -> bool:
        return self in (PageState.SUCCEEDED, PageState.FAILED)


class RollupState(str, Enum):
    """The state of a document or an ingest, rolled up from its pages."""

    REGISTERING = "registering"  # an ingest whose documents are still being registered
    QUEUED = JobStatus.QUEUED.value
    RUNNING = JobStatus.RUNNING.value
    SUCCEEDED = JobStatus.SUCCEEDED.value
    FAILED = JobStatus.FAILED.value
    PARTIAL = "partial"  # final, some pages succeeded and some failed

    @property
    def final(self) -> bool:
        return self in (RollupState.SUCCEEDED, RollupState.FAILED, RollupState.PARTIAL)


class OutputsState(str, Enum):
    """A finished document's outputs (JSON, markdown, searchable PDF): due, stored, or given up on."""

    PENDING = "pending"
    WRITTEN = "written"
    FAILED = JobStatus.FAILED.value


def rollup(*, total: int, succeeded: int, failed: int, running: int, registered: bool = True) -> RollupState:
    """The state of a document or an ingest with these page counts (``registered``: every document is)."""
    if not registered:
        return RollupState.REGISTERING
    if succeeded + failed < total:
        return RollupState.RUNNING if running or succeeded or failed else RollupState.QUEUED
    if failed == 0:
        return RollupState.SUCCEEDED
    return RollupState.FAILED if succeeded == 0 else RollupState.PARTIAL


@dataclass
class Progress:
    """Pages of an ingest or a document by state, and how fast they finish."""

    total: int
    succeeded: int
    failed: int
    running: int
    unpublished: int
    pages_per_s: float | None = None
    eta_s: float | None = None

    @property
    def queued(self) -> int:
        return max(0, self.total - self.succeeded - self.failed - self.running - self.unpublished)

    @property
    def done(self) -> bool:
        return self.succeeded + self.failed >= self.total

    def state(self, *, registered: bool = True) -> RollupState:
        return rollup(total=self.total, succeeded=self.succeeded, failed=self.failed, running=self.running,
                      registered=registered)

    def counts(self) -> dict[str, int]:
        """Pages by the state each shows, keyed by its word."""
        return {PageState.QUEUED.value: self.queued, PageState.UNPUBLISHED.value: self.unpublished,
                PageState.RUNNING.value: self.running, PageState.SUCCEEDED.value: self.succeeded,
                PageState.FAILED.value: self.failed}


@dataclass(frozen=True)
class EngineShare:
    """An ingest's share of the engine now: ``fraction`` of the pages started (its weights among those waiting
    in its lane, times its lane's part of the starts of the last minute or two), and how many pages the engine
    started per second over that time (None: none started)."""

    fraction: float
    pages_per_s: float | None

    def eta_s(self, pages_left: int) -> float | None:
        """Seconds until ``pages_left`` pages are done at this share (None: no rate known)."""
        if not self.pages_per_s or self.fraction <= 0:
            return None
        return pages_left / (self.pages_per_s * self.fraction)


# --- the same rules in SQL, for the operators' views --------------------------------------------------


def _quoted(state: Enum) -> str:
    return f"'{state.value}'"


def state_sql(status: str, state: JobStatus) -> str:
    """SQL for "the job is in ``state``": ``status`` is a job's status column expression."""
    return f"{status} = {_quoted(state)}"


def unpublished_sql(status: str, enqueued_at: str) -> str:
    """SQL for ``PageState.UNPUBLISHED``: queued, and its message never handed to the broker."""
    return f"{state_sql(status, JobStatus.QUEUED)} AND {enqueued_at} IS NULL"


def page_state_sql(status: str, enqueued_at: str) -> str:
    """SQL for ``PageState.of``: ``status`` and ``enqueued_at`` are column expressions of a job."""
    return (f"CASE WHEN {unpublished_sql(status, enqueued_at)} "
            f"THEN {_quoted(PageState.UNPUBLISHED)} ELSE {status} END")


def rollup_sql(*, total: str, succeeded: str, failed: str, running: str, registered: str | None = None) -> str:
    """SQL for ``rollup`` over count column expressions (``registered``: a boolean expression, for ingests)."""
    final = f"""CASE WHEN {failed} = 0 THEN {_quoted(RollupState.SUCCEEDED)}
                     WHEN {succeeded} = 0 THEN {_quoted(RollupState.FAILED)}
                     ELSE {_quoted(RollupState.PARTIAL)} END"""
    state = f"""CASE WHEN {succeeded} + {failed} >= {total} THEN {final}
                     WHEN {running} > 0 OR {succeeded} + {failed} > 0 THEN {_quoted(RollupState.RUNNING)}
                     ELSE {_quoted(RollupState.QUEUED)} END"""
    if registered is None:
        return state
    return f"CASE WHEN NOT ({registered}) THEN {_quoted(RollupState.REGISTERING)} ELSE {state} END"
