"""The database schema (SQLAlchemy 2 declarative). Alembic migrations in storage/migrations own it.

``jobs`` is the table operators poll: one row per page, its status, attempts, readable error,
where its original and results live, and one column per pipeline stage with its seconds, so
"where does the time go" is a plain SQL ``avg()`` away. ``results`` indexes finished pages.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, DateTime, Float, Index, Integer, String, Text, UniqueConstraint, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("job_key", name="uq_jobs_job_key"),
        Index("ix_jobs_status_lane", "status", "lane"),
        Index("ix_jobs_content_sha256", "content_sha256"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    # sha256 of (page content, task options): the same page asked for the same thing is one job.
    job_key: Mapped[str] = mapped_column(String(64))
    content_sha256: Mapped[str] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(Text)
    page: Mapped[int] = mapped_column(Integer, default=1)
    lane: Mapped[str] = mapped_column(String(16))
    priority: Mapped[int] = mapped_column(Integer, default=0)
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
