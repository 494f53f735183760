"""A page's result as stored: its job's result JSON, told which document and page it is."""

from __future__ import annotations

import json
import logging

from paperlane.errors import PaperlaneError
from paperlane.schemas import JobStatus, PageResult, Task
from paperlane.storage.objects import ObjectStore
from paperlane.storage.tables import JobRow

log = logging.getLogger(__name__)


def page_result(store: ObjectStore, job: JobRow, *, source: str, page_no: int) -> PageResult:
    """A page's result: its job's stored result, or a failed one saying why there is none."""
    result: PageResult | None = None
    if job.status == JobStatus.SUCCEEDED.value and job.result_key:
        try:
            result = PageResult.model_validate(json.loads(store.get(job.result_key)))
        except (PaperlaneError, ValueError) as exc:
            log.warning("stored result of job %s unreadable (%s)", job.id, exc)
    if result is None:
        error = job.error or ("not finished" if job.status in (JobStatus.QUEUED.value, JobStatus.RUNNING.value)
                              else "stored result missing")
        result = PageResult(job_id=job.id, source=source, page=page_no, status=JobStatus.FAILED,
                            error=error, task=Task(job.task))
    return result.model_copy(update={"source": source, "page": page_no})
