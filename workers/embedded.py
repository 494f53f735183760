"""``paperlane run``: the whole pipeline in one process, on the embedded stack by default.

Pages are registered exactly as ``paperlane submit`` does (originals in the object store, rows
in the database), then processed in micro-batches with the next batch already preprocessing in
the CPU pool while the engine works on the current one. Pages already done earlier with the
same content and task are not redone: their stored result is copied out.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from paperlane.errors import PaperlaneError
from paperlane.schemas import JobStatus, PageResult, TaskSpec
from priority.lanes import Lane
from producer.inputs import PageInput
from producer.submit import Submitted, submit_pages
from storage import jobs as jobstore
from storage.objects import annotated_key, result_key
from storage.tables import JobRow
from workers.attempts import settle
from workers.pipeline import PageOutcome, Runtime, prefetch, result_json, run_batch

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    results: list[tuple[str, PageResult]] = field(default_factory=list)  # (output name, result)
    seconds: float = 0.0

    @property
    def failed(self) -> int:
        return sum(1 for _, r in self.results if r.status is JobStatus.FAILED)


def run_embedded(rt: Runtime, pages: Iterable[PageInput], *, out_dir: Path, spec: TaskSpec,
                 lane: Lane = Lane.BATCH, force: bool = False,
                 on_page: Callable[[str, PageResult], None] | None = None) -> RunSummary:
    """Process ``pages`` and write ``out_dir/<name>.json`` (+ ``.png`` on success) for each."""
    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = RunSummary()
    names = _Names()

    def emit(name: str, result: PageResult, png: bytes | None) -> None:
        (out_dir / f"{name}.json").write_bytes(result_json(result))
        if png is not None:
            (out_dir / f"{name}.png").write_bytes(png)
        summary.results.append((name, result))
        if on_page:
            on_page(name, result)

    todo: list[tuple[str, JobRow]] = []
    for sub in submit_pages(pages, db=rt.db, store=rt.store, spec=spec, lane=lane, force=force):
        name = names.unique(sub.page.name)
        done_before = sub.action == "exists" and sub.job.status == JobStatus.SUCCEEDED.value
        if sub.action == "failed" or done_before:
            emit(name, *_stored(rt, sub))
        else:  # new, requeued, or left queued/running by an earlier run that stopped
            todo.append((name, sub.job))
    _process(rt, todo, emit)
    summary.seconds = time.perf_counter() - t0
    return summary


def _process(rt: Runtime, todo: list[tuple[str, JobRow]], emit: Callable[[str, PageResult, bytes | None], None]) -> None:
    size = rt.settings.worker.batch_size
    batches = [todo[i:i + size] for i in range(0, len(todo), size)]
    started = [_start(rt, job) for _, job in batches[0]] if batches else []
    ahead = prefetch(rt, started)
    for k, batch in enumerate(batches):
        jobs, current = started, ahead
        if k + 1 < len(batches):  # the pool prepares batch k+1 while the engine runs batch k
            started = [_start(rt, job) for _, job in batches[k + 1]]
            ahead = prefetch(rt, started)
        for (name, _), outcome in zip(batch, run_batch(rt, jobs, current)):
            outcome = _until_settled(rt, outcome)
            png = rt.store.get(annotated_key(outcome.job.id)) if outcome.ok else None
            emit(name, outcome.result, png)


def _start(rt: Runtime, job: JobRow) -> JobRow:
    return jobstore.start_attempt(rt.db, job.id) or job


def _until_settled(rt: Runtime, outcome: PageOutcome) -> PageOutcome:
    """Apply the retry policy in process: retry the page alone after the backoff, or give up."""
    while True:
        decision = settle(rt.db, outcome, rt.settings.worker)
        if decision.action != "retry":
            return outcome
        time.sleep(decision.delay)
        job = jobstore.start_attempt(rt.db, outcome.job.id) or outcome.job
        outcome = run_batch(rt, [job])[0]


def _stored(rt: Runtime, sub: Submitted) -> tuple[PageResult, bytes | None]:
    """The result of a page that needs no work now: done earlier, or refused at submission."""
    job = sub.job
    if job.result_key:
        try:
            result = PageResult.model_validate(json.loads(rt.store.get(job.result_key)))
            png = rt.store.get(job.annotated_key) if job.annotated_key else None
            return result, png
        except PaperlaneError as exc:
            log.warning("stored result of job %s unreadable (%s)", job.id, exc)
    reason = job.error or "stored result missing"
    return PageResult(job_id=job.id, source=sub.page.source, page=sub.page.page, status=JobStatus.FAILED,
                      error=reason, task=job.task), None


class _Names:
    """Output stems unique within one run: a repeated stem gets -2, -3, ..."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def unique(self, name: str) -> str:
        n = self._seen.get(name, 0) + 1
        self._seen[name] = n
        return name if n == 1 else f"{name}-{n}"
