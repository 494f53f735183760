"""The database schema (SQLAlchemy 2 declarative). Alembic migrations in storage/migrations own it.

    ingests     one submit (or API batch): its name, lane, task and rolled-up counts
     └ documents  one input file or archive member: its source, original, page count, counts, outputs
        └ pages     document + page number -> the job that does its work
    jobs        the content-addressed work item: same original + page + task = one inference, shared
                by every page with those bytes; its status, attempts, readable error, result, and one
                column per pipeline stage with its seconds ("where does the time go" is a SQL avg())
    job_keys    job key -> job id: what keeps one job per key (jobs has no unique key but its id on PostgreSQL)
    results     the index of succeeded jobs
    usage       per tenant and day: pages by outcome, engine tokens and seconds (written with each page's
                final state, ``storage.usage``); the view ``tenant_usage`` names the tenants

On PostgreSQL, jobs, pages and results are partitioned by month through their time-first ids
(``storage.timeids``, ``storage.history``); SQLite keeps one table each.

Counts on ingests and documents (pages_total/succeeded/failed) are kept by the writes that change
a job's state, in the same transaction, so status at any level is one row read whatever the size;
queued and running are derived (running from the few running jobs). The views ``ingest_status``,
``document_status`` and ``page_status`` give operators the same numbers and states in SQL (built from
``paperlane.status``; the newest migration that creates them says how).
"""

from __future__ import annotations

from datetime import date, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ColumnElement,
    Date,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    and_,
    false,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from paperlane.status import JobStatus, OutputsState, state_sql, unpublished_sql

_RUNNING, _FAILED = state_sql("status", JobStatus.RUNNING), state_sql("status", JobStatus.FAILED)
_UNPUBLISHED = unpublished_sql("status", "enqueued_at")


class Base(DeclarativeBase):
    pass


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_status_lane", "status", "lane"),
        Index("ix_jobs_content_sha256", "content_sha256"),
        # Partial: the few jobs in progress, and those whose message never reached the broker.
        Index("ix_jobs_running", "id", postgresql_where=_RUNNING, sqlite_where=_RUNNING),
        Index("ix_jobs_unpublished", "id", postgresql_where=_UNPUBLISHED, sqlite_where=_UNPUBLISHED),
        Index("ix_jobs_failed", "id", postgresql_where=_FAILED, sqlite_where=_FAILED),
        Index("ix_jobs_review", "id", postgresql_where="needs_review", sqlite_where="needs_review"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    # sha256 of (page content, task options): the same page asked for the same thing is one job.
    job_key: Mapped[str] = mapped_column(String(64))
    content_sha256: Mapped[str] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(Text)  # the first document that asked for it
    page: Mapped[int] = mapped_column(Integer, default=1)  # page (frame) number inside the original
    lane: Mapped[str] = mapped_column(String(16))
    # The message priority, 0-9 (0 first): the lane's base plus the 0-4 priority the submitter gave.
    message_priority: Mapped[int] = mapped_column("priority", Integer, default=0)
    task: Mapped[str] = mapped_column(String(16))
    task_options: Mapped[dict] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    error_stage: Mapped[str | None] = mapped_column(String(16), nullable=True)
    original_key: Mapped[str | None] = mapped_column(Text, nullable=True)
    result_key: Mapped[str | None] = mapped_column(Text, nullable=True)
    annotated_key: Mapped[str | None] = mapped_column(Text, nullable=True)
    engine: Mapped[str | None] = mapped_column(String(64), nullable=True)
    upload_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    queue_wait_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    preprocess_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    inference_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    postprocess_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    store_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # A running job is held by a worker until lease_until, which that worker keeps pushing ahead; a job whose
    # lease ran out (its worker died or hung) goes back to its lane (storage.leases).
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # A succeeded job's quality grade (PageResult.quality): whether a person should look at it, why (its flags,
    # comma-separated), and its confidence.
    needs_review: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    review_flags: Mapped[str | None] = mapped_column(Text, nullable=True)
    confidence: Mapped[float | None] = mapped_column(Float, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), onupdate=func.now()
    )


class ResultRow(Base):
    """The results index: one row per succeeded page, keyed by job id (a rewrite replaces it)."""

    __tablename__ = "results"

    job_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    content_sha256: Mapped[str] = mapped_column(String(64), index=True)
    task: Mapped[str] = mapped_column(String(16))
    engine: Mapped[str] = mapped_column(String(64))
    line_count: Mapped[int] = mapped_column(Integer)
    mean_confidence: Mapped[float | None] = mapped_column(Float, nullable=True)
    text: Mapped[str] = mapped_column(Text)
    result_key: Mapped[str] = mapped_column(Text)
    annotated_key: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


_TS = DateTime(timezone=True)
_DUE = "delivered_at IS NULL AND given_up_at IS NULL"


class IngestRow(Base):
    __tablename__ = "ingests"
    __table_args__ = (Index("ix_ingests_ingest_key", "ingest_key"),
                      Index("ix_ingests_key_open", "api_key_id", "finished_at"),
                      Index("ix_ingests_tenant_open", "tenant_id", "finished_at"))

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    # sha256 of (name, sources, lane, task): an interrupted submit of the same thing resumes this ingest.
    ingest_key: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(Text)
    lane: Mapped[str] = mapped_column(String(16))
    task: Mapped[str] = mapped_column(String(16))
    task_options: Mapped[dict] = mapped_column(JSON, default=dict)
    documents_total: Mapped[int] = mapped_column(Integer, default=0)
    pages_total: Mapped[int] = mapped_column(Integer, default=0)
    pages_succeeded: Mapped[int] = mapped_column(Integer, default=0)
    pages_failed: Mapped[int] = mapped_column(Integer, default=0)
    pages_review: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # succeeded, needing review
    skipped: Mapped[int] = mapped_column(Integer, default=0)  # files in folders/archives that hold no pages
    created_at: Mapped[datetime] = mapped_column(_TS, server_default=func.now())
    registered_at: Mapped[datetime | None] = mapped_column(_TS, nullable=True)  # every document registered
    first_done_at: Mapped[datetime | None] = mapped_column(_TS, nullable=True)
    last_done_at: Mapped[datetime | None] = mapped_column(_TS, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(_TS, nullable=True)  # registered and every page final
    tenant_id: Mapped[str | None] = mapped_column(String(36), nullable=True)  # None: from the command line
    api_key_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    callback_url: Mapped[str | None] = mapped_column(Text, nullable=True)  # POSTed when it finishes
    error: Mapped[str | None] = mapped_column(Text, nullable=True)  # why its registration stopped short
    # Its share of its tenant's turns in the lane, beside the tenant's other ingests (priority.fair).
    weight: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")


_OUTPUTS_DUE = f"outputs = '{OutputsState.PENDING.value}'"


class DocumentRow(Base):
    __tablename__ = "documents"
    __table_args__ = (Index("ix_documents_ingest", "ingest_id", "seq"),
                      Index("ix_documents_outputs_due", "outputs_claimed_until", postgresql_where=_OUTPUTS_DUE,
                            sqlite_where=_OUTPUTS_DUE))

    id: Mapped[str] = mapped_column(String(36), primary_key=True)  # uuid5(ingest, source): re-registering finds it
    ingest_id: Mapped[str] = mapped_column(String(36), ForeignKey("ingests.id"))
    seq: Mapped[int] = mapped_column(Integer)  # order of registration within the ingest
    source: Mapped[str] = mapped_column(Text)
    name: Mapped[str] = mapped_column(Text)  # output stem
    ext: Mapped[str] = mapped_column(String(16))
    content_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    original_key: Mapped[str | None] = mapped_column(Text, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)  # refused whole (its one page fails)
    pages_total: Mapped[int] = mapped_column(Integer, default=0)
    pages_succeeded: Mapped[int] = mapped_column(Integer, default=0)
    pages_failed: Mapped[int] = mapped_column(Integer, default=0)
    pages_review: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # succeeded, needing review
    json_key: Mapped[str | None] = mapped_column(Text, nullable=True)
    markdown_key: Mapped[str | None] = mapped_column(Text, nullable=True)
    pdf_key: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(_TS, server_default=func.now())
    finished_at: Mapped[datetime | None] = mapped_column(_TS, nullable=True)  # its last page final
    # Its outputs, a unit of work due from the transaction that finishes it (status.OutputsState; None while
    # it is not finished): claimed by a worker until ``outputs_claimed_until``, which also serves as the time
    # a failed try may be retried; ``outputs_error`` says why the last try failed.
    outputs: Mapped[str | None] = mapped_column(String(16), nullable=True)
    outputs_attempts: Mapped[int] = mapped_column(Integer, default=0)
    outputs_claimed_until: Mapped[datetime | None] = mapped_column(_TS, nullable=True)
    outputs_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The formats its outputs were written in (OutputFormat values; each file's key follows from the id, the format
    # and the page), set when they are; None for outputs written before it existed (json_key, markdown_key and
    # pdf_key say which).
    output_formats: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)


class PageRow(Base):
    __tablename__ = "pages"
    __table_args__ = (
        # Not unique: a unique key on PostgreSQL's partitioned pages must hold the id, which is derived from these two.
        Index("ix_pages_document_page", "document_id", "page_no"),
        Index("ix_pages_job", "job_id"),
        Index("ix_pages_ingest", "ingest_id"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)  # uuid5(document, page_no)
    document_id: Mapped[str] = mapped_column(String(36), ForeignKey("documents.id"))
    ingest_id: Mapped[str] = mapped_column(String(36))  # the document's, kept here to count without a join
    page_no: Mapped[int] = mapped_column(Integer)
    # No foreign key: jobs are shared across months and dropped by ``storage.history``, which keeps a month's jobs
    # while newer pages still use them.
    job_id: Mapped[str] = mapped_column(String(36))
    created_at: Mapped[datetime] = mapped_column(_TS, server_default=func.now())


class JobKeyRow(Base):
    """Which job a job key belongs to: the one key unique across the partitions of PostgreSQL's jobs (registration
    claims a key here before it inserts the job; ``storage.history`` forgets the keys of the jobs it drops)."""

    __tablename__ = "job_keys"

    job_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(36), index=True)


class IngestFailureRow(Base):
    """Failed pages of an ingest by reason, kept with the counts: "what failed" without scanning its pages."""

    __tablename__ = "ingest_failures"

    ingest_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    reason: Mapped[str] = mapped_column(Text, primary_key=True)
    pages: Mapped[int] = mapped_column(Integer, default=0)


class TenantRow(Base):
    """Who owns ingests made through the API; its secret signs the webhooks it receives."""

    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    webhook_secret: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(_TS, server_default=func.now())
    # Pages of its ingests reserved as they are registered and not final yet: the budget a registration reserves
    # from atomically (storage.tenants.reserve_pages), released by the writes that make pages final.
    pages_in_flight: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    max_pages_in_flight: Mapped[int | None] = mapped_column(Integer, nullable=True)  # None: api.max_pages_in_flight
    weight: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")  # its share of each lane
    monthly_pages: Mapped[int | None] = mapped_column(Integer, nullable=True)  # None: no monthly budget
    # Pages reserved in the month starting ``month_start`` (PageBudget.reserve: the same UPDATE as pages_in_flight).
    month_start: Mapped[date | None] = mapped_column(Date, nullable=True)
    month_pages: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class IngestGrantRow(Base):
    """An S3 prefix a tenant may ingest (``POST /v1/ingests``): objects of ``bucket`` whose keys start with
    ``prefix`` ("" for the whole bucket, otherwise ending in "/")."""

    __tablename__ = "ingest_grants"

    tenant_id: Mapped[str] = mapped_column(String(36), ForeignKey("tenants.id"), primary_key=True)
    bucket: Mapped[str] = mapped_column(String(255), primary_key=True)
    prefix: Mapped[str] = mapped_column(String(1024), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(_TS, server_default=func.now())


class UsageRow(Base):
    """What a tenant used in a day (UTC): its pages by outcome, as each page became final (a page counts once,
    a job shared by several pages counts per page), and the engine work of the jobs that made them final."""

    __tablename__ = "usage"

    tenant_id: Mapped[str] = mapped_column(String(36), primary_key=True)  # "" for the command line's ingests
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    pages_succeeded: Mapped[int] = mapped_column(Integer, default=0)
    pages_failed: Mapped[int] = mapped_column(Integer, default=0)
    pages_review: Mapped[int] = mapped_column(Integer, default=0)  # succeeded pages flagged for a person to check
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    engine_seconds: Mapped[float] = mapped_column(Float, default=0.0)


class ApiKeyRow(Base):
    """An API key: only its sha256 is kept; the key itself is shown once, when it is made."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(36), ForeignKey("tenants.id"))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))  # the key's first characters, to tell keys apart in lists
    interactive: Mapped[bool] = mapped_column(Boolean, default=False)  # may use the interactive lane
    created_at: Mapped[datetime] = mapped_column(_TS, server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(_TS, nullable=True)


class WebhookDeliveryRow(Base):
    """One webhook to deliver (an outbox row written with the change that triggers it), retried until it is
    delivered or given up; each try is a ``WebhookAttemptRow``."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhooks_due", "next_at", postgresql_where=_DUE, sqlite_where=_DUE),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(36))
    ingest_id: Mapped[str] = mapped_column(String(36), ForeignKey("ingests.id"))
    url: Mapped[str] = mapped_column(Text)
    event: Mapped[str] = mapped_column(String(40))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_at: Mapped[datetime] = mapped_column(_TS)
    delivered_at: Mapped[datetime | None] = mapped_column(_TS, nullable=True)
    given_up_at: Mapped[datetime | None] = mapped_column(_TS, nullable=True)
    last_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(_TS, server_default=func.now())


class WebhookAttemptRow(Base):
    __tablename__ = "webhook_attempts"

    delivery_id: Mapped[str] = mapped_column(String(36), ForeignKey("webhook_deliveries.id"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(_TS)
    status: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the receiver's HTTP status, if it answered
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    seconds: Mapped[float] = mapped_column(Float)


def unpublished(jobs: Table) -> ColumnElement[bool]:
    """``PageState.UNPUBLISHED`` over ``jobs``: queued, its message never handed to the broker (the partial index
    ``ix_jobs_unpublished`` serves it)."""
    return and_(jobs.c.status == JobStatus.QUEUED.value, jobs.c.enqueued_at.is_(None))
