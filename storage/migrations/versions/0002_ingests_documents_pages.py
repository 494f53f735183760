"""ingests, documents and pages over the content-addressed jobs; status views

Today's job rows are carried over: one ingest named "before ingests" holds a document per distinct
source and a page per job, with the counts their statuses give.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)
_NAMESPACE = uuid.UUID("6a0b3c8e-3f0e-4f43-9d55-70617065726c")  # storage.ingests uses the same
LEGACY_INGEST = str(uuid.uuid5(_NAMESPACE, "ingest:before-ingests"))


def _counts() -> list[sa.Column]:
    return [sa.Column(c, sa.Integer, nullable=False, server_default="0")
            for c in ("pages_total", "pages_succeeded", "pages_failed")]


def upgrade() -> None:
    op.create_table(
        "ingests",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("ingest_key", sa.String(64), nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("lane", sa.String(16), nullable=False),
        sa.Column("task", sa.String(16), nullable=False),
        sa.Column("task_options", sa.JSON, nullable=False),
        sa.Column("documents_total", sa.Integer, nullable=False, server_default="0"),
        *_counts(),
        sa.Column("skipped", sa.Integer, nullable=False, server_default="0"),
        sa.Column("created_at", _TS, nullable=False, server_default=sa.func.now()),
        sa.Column("registered_at", _TS),
        sa.Column("first_done_at", _TS),
        sa.Column("last_done_at", _TS),
    )
    op.create_index("ix_ingests_ingest_key", "ingests", ["ingest_key"])
    op.create_table(
        "documents",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("ingest_id", sa.String(36), sa.ForeignKey("ingests.id"), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("ext", sa.String(16), nullable=False),
        sa.Column("content_sha256", sa.String(64)),
        sa.Column("original_key", sa.Text),
        sa.Column("error", sa.Text),
        *_counts(),
        sa.Column("json_key", sa.Text),
        sa.Column("markdown_key", sa.Text),
        sa.Column("pdf_key", sa.Text),
        sa.Column("created_at", _TS, nullable=False, server_default=sa.func.now()),
        sa.Column("finished_at", _TS),
    )
    op.create_index("ix_documents_ingest", "documents", ["ingest_id", "seq"])
    op.create_table(
        "pages",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("document_id", sa.String(36), sa.ForeignKey("documents.id"), nullable=False),
        sa.Column("ingest_id", sa.String(36), nullable=False),
        sa.Column("page_no", sa.Integer, nullable=False),
        sa.Column("job_id", sa.String(36), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("created_at", _TS, nullable=False, server_default=sa.func.now()),
        sa.UniqueConstraint("document_id", "page_no", name="uq_pages_document_page"),
    )
    op.create_table(
        "ingest_failures",
        sa.Column("ingest_id", sa.String(36), primary_key=True),
        sa.Column("reason", sa.Text, primary_key=True),
        sa.Column("pages", sa.Integer, nullable=False, server_default="0"),
    )
    op.create_index("ix_pages_job", "pages", ["job_id"])
    op.create_index("ix_pages_ingest", "pages", ["ingest_id"])
    for name, where in (("ix_jobs_running", "status = 'running'"),
                        ("ix_jobs_unpublished", "status = 'queued' AND enqueued_at IS NULL"),
                        ("ix_jobs_failed", "status = 'failed'")):
        op.create_index(name, "jobs", ["id"], postgresql_where=sa.text(where), sqlite_where=sa.text(where))
    _carry_over_jobs()
    _create_views(op.get_bind().dialect.name)


def _carry_over_jobs() -> None:
    """One ingest for every job row so far: a document per source, a page per job."""
    bind = op.get_bind()
    jobs = bind.execute(sa.text("SELECT id, source, page, status, lane, task, created_at, finished_at "
                                "FROM jobs ORDER BY created_at, source, page")).all()
    if not jobs:
        return
    now = datetime.now(UTC)
    docs: dict[str, dict] = {}
    pages = []
    seen: set[tuple[str, int]] = set()
    totals: dict[str, int] = defaultdict(int)
    for job in jobs:
        doc = docs.get(job.source)
        if doc is None:
            name = job.source.replace("\\", "/").rsplit("/", 1)[-1].rsplit("!", 1)[-1]
            doc = docs[job.source] = dict(
                id=str(uuid.uuid5(_NAMESPACE, f"document:{LEGACY_INGEST}:{job.source}")), ingest_id=LEGACY_INGEST,
                seq=len(docs), source=job.source, name=(name.rsplit(".", 1)[0] or name)[:100],
                ext=("." + name.rsplit(".", 1)[1].lower())[:16] if "." in name else "",
                pages_total=0, pages_succeeded=0, pages_failed=0, created_at=now)
        if (job.source, job.page) in seen:
            continue
        seen.add((job.source, job.page))
        doc["pages_total"] += 1
        for status in ("succeeded", "failed"):
            if job.status == status:
                doc[f"pages_{status}"] += 1
                totals[status] += 1
        pages.append(dict(id=str(uuid.uuid5(_NAMESPACE, f"page:{doc['id']}:{job.page}")), document_id=doc["id"],
                          ingest_id=LEGACY_INGEST, page_no=job.page, job_id=job.id, created_at=now))
    for doc in docs.values():
        doc["finished_at"] = now if doc["pages_succeeded"] + doc["pages_failed"] == doc["pages_total"] else None
    meta = sa.MetaData()
    meta.reflect(bind, only=("ingests", "documents", "pages"))
    bind.execute(meta.tables["ingests"].insert(), [dict(
        id=LEGACY_INGEST, ingest_key="before-ingests", name="before ingests (migrated)", lane=jobs[0].lane,
        task=jobs[0].task, task_options={}, documents_total=len(docs), pages_total=len(pages),
        pages_succeeded=totals["succeeded"], pages_failed=totals["failed"], skipped=0, created_at=now,
        registered_at=now)])
    bind.execute(meta.tables["documents"].insert(), list(docs.values()))
    reasons: dict[str, int] = defaultdict(int)
    for job in bind.execute(sa.text("SELECT error FROM jobs WHERE status = 'failed'")):
        reasons[job.error or "unknown"] += 1
    if reasons:
        failures = sa.table("ingest_failures", sa.column("ingest_id"), sa.column("reason"), sa.column("pages"))
        bind.execute(failures.insert(), [dict(ingest_id=LEGACY_INGEST, reason=r, pages=n) for r, n in reasons.items()])
    for i in range(0, len(pages), 5000):
        bind.execute(meta.tables["pages"].insert(), pages[i:i + 5000])


def _create_views(dialect: str) -> None:
    if dialect == "postgresql":
        seconds = "GREATEST(EXTRACT(EPOCH FROM ({a}) - ({b})), 0)"
    else:
        seconds = "MAX((julianday({a}) - julianday({b})) * 86400.0, 0)"
    # pages/s from the first page done to the last; the estimate extends it over the pages left.
    rate = (f"CASE WHEN {{t}}.pages_succeeded + {{t}}.pages_failed > 1 AND {{t}}.last_done_at > {{t}}.first_done_at "
            f"THEN ({{t}}.pages_succeeded + {{t}}.pages_failed - 1) / "
            f"{seconds.format(a='{t}.last_done_at', b='{t}.first_done_at')} END")
    op.execute("""
        CREATE VIEW page_status AS
        SELECT p.id AS page_id, p.document_id, p.ingest_id, p.page_no, d.source, p.job_id,
               CASE WHEN j.status = 'queued' AND j.enqueued_at IS NULL THEN 'unpublished' ELSE j.status END
                   AS status,
               j.attempts, j.error, j.error_stage, j.result_key, j.annotated_key, j.lane, j.task,
               j.upload_s, j.queue_wait_s, j.preprocess_s, j.inference_s, j.postprocess_s, j.store_s,
               j.started_at, j.finished_at
        FROM pages p JOIN jobs j ON j.id = p.job_id JOIN documents d ON d.id = p.document_id
    """)
    op.execute("""
        CREATE VIEW document_status AS
        SELECT d.id AS document_id, d.ingest_id, d.source, d.name, d.error, d.pages_total,
               d.pages_succeeded, d.pages_failed,
               (SELECT count(*) FROM pages p JOIN jobs j ON j.id = p.job_id
                WHERE p.document_id = d.id AND j.status = 'running') AS pages_running,
               CASE WHEN d.pages_succeeded + d.pages_failed >= d.pages_total THEN
                   CASE WHEN d.pages_failed = 0 THEN 'succeeded' WHEN d.pages_succeeded = 0 THEN 'failed'
                        ELSE 'partial' END
                    WHEN d.pages_succeeded + d.pages_failed > 0 THEN 'running' ELSE 'queued' END AS status,
               d.json_key, d.markdown_key, d.pdf_key, d.created_at, d.finished_at
        FROM documents d
    """)
    op.execute(f"""
        CREATE VIEW ingest_status AS
        SELECT i.id AS ingest_id, i.name, i.lane, i.task, i.documents_total, i.pages_total,
               i.pages_succeeded, i.pages_failed,
               (SELECT count(*) FROM jobs j JOIN pages p ON p.job_id = j.id
                WHERE j.status = 'running' AND p.ingest_id = i.id) AS pages_running,
               i.pages_total - i.pages_succeeded - i.pages_failed AS pages_not_done,
               i.skipped, {rate.format(t='i')} AS pages_per_s,
               (i.pages_total - i.pages_succeeded - i.pages_failed) / NULLIF({rate.format(t='i')}, 0) AS eta_s,
               i.registered_at IS NOT NULL AS registered, i.created_at, i.first_done_at, i.last_done_at
        FROM ingests i
    """)


def downgrade() -> None:
    for view in ("ingest_status", "document_status", "page_status"):
        op.execute(f"DROP VIEW {view}")
    for name in ("ix_jobs_failed", "ix_jobs_unpublished", "ix_jobs_running"):
        op.drop_index(name, "jobs")
    op.drop_table("ingest_failures")
    op.drop_table("pages")
    op.drop_table("documents")
    op.drop_table("ingests")
