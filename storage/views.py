"""What status shows, in one shape: an ingest's, a document's and a page's view, as the HTTP API answers it and
``paperlane status --json`` prints it (the CLI's table reads the same view). States and their words are
``paperlane.status``'s.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from paperlane.schemas import OutputFormat, PageResult
from paperlane.status import EngineShare, JobStatus, OutputsState, PageState, Progress, RollupState
from paperlane.storage.outputs import written_formats
from paperlane.storage.status_reads import ReviewPage
from paperlane.storage.tables import DocumentRow, IngestRow, JobRow


def ingest_view(row: IngestRow, p: Progress, failures: list[tuple[str, int]], *,
                share: EngineShare | None = None) -> dict[str, Any]:
    """An ingest: its state, its pages by state, its speed and time left, its failures by reason, why its
    registration stopped short (``error``; an ingest that registered nothing for that reason has failed), and its
    share of the engine now with the time it needs at that share (``share``: none while none of its pages waits)."""
    share_eta = share.eta_s(p.total - p.succeeded - p.failed) if share is not None else None
    state = p.state(registered=row.registered_at is not None)
    if row.error and p.total == 0:
        state = RollupState.FAILED
    return {
        "ingest_id": row.id, "name": row.name, "lane": row.lane, "task": row.task, "status": state.value,
        "error": row.error, "documents": row.documents_total, "skipped": row.skipped, "pages": p.total, **p.counts(),
        "needs_review": row.pages_review,
        "pages_per_s": round(p.pages_per_s, 2) if p.pages_per_s else None,
        "eta_s": round(p.eta_s, 1) if p.eta_s is not None else None,
        "share": round(share.fraction, 4) if share is not None else None,
        "share_eta_s": round(share_eta, 1) if share_eta is not None else None,
        "failures": _failures(failures), "created_at": _iso(row.created_at), "finished_at": _iso(row.finished_at),
    }


def document_view(row: DocumentRow, p: Progress, failures: list[tuple[str, int]]) -> dict[str, Any]:
    """A document: its state, its pages by state, its failures by reason, and its outputs' state."""
    return {
        "document_id": row.id, "ingest_id": row.ingest_id, "name": row.name, "source": row.source,
        "status": p.state().value, "error": row.error, "pages": p.total, **p.counts(),
        "needs_review": row.pages_review,
        "failures": _failures(failures), "outputs": outputs_view(row),
        "created_at": _iso(row.created_at), "finished_at": _iso(row.finished_at),
    }


def outputs_view(row: DocumentRow) -> dict[str, Any]:
    """The document's outputs: ``state`` (pending, written, failed; None until its last page is final), which
    of them exist (``formats``: every format written), and why the last try failed."""
    formats = written_formats(row)
    return {"state": OutputsState(row.outputs).value if row.outputs else None, "json": OutputFormat.JSON in formats,
            "markdown": OutputFormat.MD in formats, "pdf": OutputFormat.PDF in formats,
            "formats": [fmt.value for fmt in formats], "error": row.outputs_error}


def page_state(job: JobRow) -> PageState:
    return PageState.of(job.status, published=job.enqueued_at is not None)


def page_view(page_id: str, document_id: str, page_no: int, job: JobRow, *,
              result: PageResult | None = None) -> dict[str, Any]:
    """A page: its state, its error, where its annotated image is (a page read: the worker drew it, or the API
    draws it when asked, ``workers.drawing``), and its result when given."""
    drawn = job.annotated_key or job.status == JobStatus.SUCCEEDED
    view: dict[str, Any] = {
        "page_id": page_id, "document_id": document_id, "page_no": page_no, "job_id": job.id,
        "status": page_state(job).value, "error": job.error,
        "annotated_url": f"/v1/pages/{page_id}/annotated" if drawn else None,
    }
    if result is not None:
        view["result"] = result.model_dump(mode="json", exclude={"job_id"})
    return view


def job_view(row: JobRow, timings: dict[str, float], *, result_url: str | None,
             annotated_url: str | None) -> dict[str, Any]:
    """A job (``paperlane status JOB_ID``): its state, attempts, error, stage timings, the worker holding it."""
    running = row.status == JobStatus.RUNNING
    return {
        "job_id": row.id, "status": page_state(row).value, "lane": row.lane, "task": row.task, "source": row.source,
        "page": row.page, "attempts": row.attempts, "error": row.error, "error_stage": row.error_stage,
        "engine": row.engine, "timings": timings, "worker": row.worker if running else None,
        "lease_until": _iso(row.lease_until) if running else None, "result": result_url, "annotated": annotated_url,
        "created_at": _iso(row.created_at), "finished_at": _iso(row.finished_at),
    }


def _failures(failures: list[tuple[str, int]]) -> list[dict[str, Any]]:
    return [{"reason": r, "pages": n} for r, n in failures]


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at else None


def review_view(page: ReviewPage) -> dict[str, Any]:
    """A page needing review: where it is, why (its quality flags), its confidence, the engine that read it and its
    annotated image (a page needing review was read: the API draws it when the worker did not)."""
    return {"page_id": page.page_id, "document_id": page.document_id, "source": page.source, "page_no": page.page_no,
            "job_id": page.job_id, "flags": page.flags, "confidence": page.confidence, "engine": page.engine,
            "annotated_url": f"/v1/pages/{page.page_id}/annotated"}
