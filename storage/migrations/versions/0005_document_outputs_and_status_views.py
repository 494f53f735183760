"""document outputs as a recorded unit of work; the status views speak paperlane.status's vocabulary

A finished document's outputs are due from the transaction that finishes it (``documents.outputs``: pending,
written, failed) and are retried until written: documents finished before this migration are ``written`` when
their outputs exist and ``pending`` (due now) when they do not. The views ``page_status``, ``document_status``
and ``ingest_status`` speak ``paperlane.status``'s words and rules as they were when this migration was written,
copied here (a migration must not change when the code does; a later change of vocabulary comes with a migration
of its own): ``document_status`` adds ``outputs``, ``ingest_status`` a ``status`` like the API's, and a document
whose pages are running is ``running`` there as everywhere.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import importlib

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)
_DUE = "outputs = 'pending'"
_VIEWS = ("ingest_status", "document_status", "page_status")
_RUNNING = "'running'"
_VERSIONS = "paperlane.storage.migrations.versions"


def page_state_sql(status: str, enqueued_at: str) -> str:
    """A job's page state in SQL, as ``paperlane.status.page_state_sql`` wrote it then."""
    return (f"CASE WHEN {status} = 'queued' AND {enqueued_at} IS NULL "
            f"THEN 'unpublished' ELSE {status} END")


def rollup_sql(*, total: str, succeeded: str, failed: str, running: str, registered: str | None = None) -> str:
    """A document's or an ingest's state in SQL, as ``paperlane.status.rollup_sql`` wrote it then."""
    final = f"""CASE WHEN {failed} = 0 THEN 'succeeded'
                     WHEN {succeeded} = 0 THEN 'failed'
                     ELSE 'partial' END"""
    state = f"""CASE WHEN {succeeded} + {failed} >= {total} THEN {final}
                     WHEN {running} > 0 OR {succeeded} + {failed} > 0 THEN 'running'
                     ELSE 'queued' END"""
    if registered is None:
        return state
    return f"CASE WHEN NOT ({registered}) THEN 'registering' ELSE {state} END"


def upgrade() -> None:
    for view in _VIEWS:
        op.execute(f"DROP VIEW {view}")
    # Plain ALTER TABLE (no batch copy on SQLite), as 0004.
    op.add_column("documents", sa.Column("outputs", sa.String(16)))
    op.add_column("documents", sa.Column("outputs_attempts", sa.Integer, nullable=False, server_default="0"))
    op.add_column("documents", sa.Column("outputs_claimed_until", _TS))
    op.add_column("documents", sa.Column("outputs_error", sa.Text))
    op.create_index("ix_documents_outputs_due", "documents", ["outputs_claimed_until"],
                    postgresql_where=sa.text(_DUE), sqlite_where=sa.text(_DUE))
    op.execute("UPDATE documents SET outputs = 'written' WHERE json_key IS NOT NULL")
    op.execute("UPDATE documents SET outputs = 'pending' "
               "WHERE json_key IS NULL AND finished_at IS NOT NULL")
    _create_views(op.get_bind().dialect.name)


def _create_views(dialect: str, *, review: bool = False) -> None:
    """The three status views; ``review``: with the counts of pages needing review (the columns 0009 adds)."""
    doc_review = "d.pages_review, " if review else ""
    ingest_review = "i.pages_review, " if review else ""
    op.execute(f"""
        CREATE VIEW page_status AS
        SELECT p.id AS page_id, p.document_id, p.ingest_id, p.page_no, d.source, p.job_id,
               {page_state_sql('j.status', 'j.enqueued_at')} AS status,
               j.attempts, j.error, j.error_stage, j.result_key, j.annotated_key, j.lane, j.task,
               j.upload_s, j.queue_wait_s, j.preprocess_s, j.inference_s, j.postprocess_s, j.store_s,
               j.started_at, j.finished_at,
               CASE WHEN j.status = {_RUNNING} THEN j.worker END AS worker,
               CASE WHEN j.status = {_RUNNING} THEN j.lease_until END AS lease_until
        FROM pages p JOIN jobs j ON j.id = p.job_id JOIN documents d ON d.id = p.document_id
    """)
    op.execute(f"""
        CREATE VIEW document_status AS
        SELECT document_id, ingest_id, source, name, error, pages_total, pages_succeeded, pages_failed, pages_running,
               {"pages_review, " if review else ""}
               {rollup_sql(total='pages_total', succeeded='pages_succeeded', failed='pages_failed',
                           running='pages_running')} AS status,
               outputs, outputs_error, json_key, markdown_key, pdf_key, created_at, finished_at
        FROM (SELECT d.id AS document_id, d.ingest_id, d.source, d.name, d.error, d.pages_total, d.pages_succeeded,
                     d.pages_failed, {doc_review}d.outputs, d.outputs_error, d.json_key, d.markdown_key, d.pdf_key,
                     d.created_at, d.finished_at,
                     (SELECT count(*) FROM pages p JOIN jobs j ON j.id = p.job_id
                      WHERE p.document_id = d.id AND j.status = {_RUNNING}) AS pages_running
              FROM documents d) AS counted
    """)
    if dialect == "postgresql":
        seconds = "GREATEST(EXTRACT(EPOCH FROM (last_done_at - first_done_at)), 0)"
    else:
        seconds = "MAX((julianday(last_done_at) - julianday(first_done_at)) * 86400.0, 0)"
    # pages/s from the first page done to the last; the estimate extends it over the pages left.
    rate = (f"CASE WHEN pages_succeeded + pages_failed > 1 AND last_done_at > first_done_at "
            f"THEN (pages_succeeded + pages_failed - 1) / {seconds} END")
    op.execute(f"""
        CREATE VIEW ingest_status AS
        SELECT ingest_id, name, lane, task, documents_total, pages_total, pages_succeeded, pages_failed,
               pages_running, {"pages_review, " if review else ""}
               pages_total - pages_succeeded - pages_failed AS pages_not_done,
               {rollup_sql(total='pages_total', succeeded='pages_succeeded', failed='pages_failed',
                           running='pages_running', registered='registered')} AS status,
               skipped, {rate} AS pages_per_s,
               (pages_total - pages_succeeded - pages_failed) / NULLIF({rate}, 0) AS eta_s,
               registered, created_at, first_done_at, last_done_at, finished_at
        FROM (SELECT i.id AS ingest_id, i.name, i.lane, i.task, i.documents_total, i.pages_total, i.pages_succeeded,
                     i.pages_failed, {ingest_review}i.skipped, i.registered_at IS NOT NULL AS registered, i.created_at,
                     i.first_done_at, i.last_done_at, i.finished_at,
                     (SELECT count(*) FROM jobs j JOIN pages p ON p.job_id = j.id
                      WHERE j.status = {_RUNNING} AND p.ingest_id = i.id) AS pages_running
              FROM ingests i) AS counted
    """)


def downgrade() -> None:
    for view in _VIEWS:
        op.execute(f"DROP VIEW {view}")
    op.drop_index("ix_documents_outputs_due", "documents")
    for column in ("outputs_error", "outputs_claimed_until", "outputs_attempts", "outputs"):
        op.drop_column("documents", column)
    # The views as 0004 left them: 0002's, with 0004's page_status.
    importlib.import_module(f"{_VERSIONS}.0002_ingests_documents_pages")._create_views(op.get_bind().dialect.name)
    op.execute("DROP VIEW page_status")
    op.execute(importlib.import_module(f"{_VERSIONS}.0004_job_leases")._page_status(leases=True))
