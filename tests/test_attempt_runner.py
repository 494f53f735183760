"""The one attempt runner (``workers.attempts.AttemptRunner``) that the Celery task and ``paperlane run`` share:
claim, hold the lease, prepare, infer, post-process, store, settle by the retry policy, write what is due."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from paperlane.errors import JobNotFound
from paperlane.priority.lanes import Lane
from paperlane.priority.messages import PageMessage
from paperlane.producer.submit import SubmittedPage, submit_documents
from paperlane.retry import Action, RetryPolicy
from paperlane.schemas import OutputFormat, PageResult, TaskSpec
from paperlane.storage import jobs as jobstore
from paperlane.storage.objects import document_key
from paperlane.storage.results import page_result
from paperlane.storage.tables import ResultRow
from paperlane.workers.attempts import AttemptRunner
from paperlane.workers.outputs import Writer
from paperlane.workers.pipeline import Runtime
from tests.test_retry_path import FlakyEngine, pages, runtime_factory  # noqa: F401 (a fixture)


class Held:
    """A lease keeper that remembers what it was asked to hold, and what it holds now."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.now: set[str] = set()

    def hold(self, job_id: str) -> None:
        self.asked.append(job_id)
        self.now.add(job_id)

    def release(self, job_id: str) -> None:
        self.now.discard(job_id)


def _registered(rt: Runtime) -> SubmittedPage:
    [page] = submit_documents(pages(1), db=rt.db, store=rt.store, spec=TaskSpec())
    return page


def _message(page: SubmittedPage) -> PageMessage:
    return PageMessage(job_id=page.job_id, lane=page.lane, message_priority=page.lane.base_priority)


def _writer(rt: Runtime, policy: RetryPolicy) -> Writer:
    cfg = rt.settings.worker
    return Writer(rt.db, rt.store, policy, hold=cfg.page_timeout, max_pixels=cfg.max_image_pixels,
                  formats=cfg.output_formats)


def test_an_attempt_is_claimed_held_stored_settled_and_its_document_written(runtime_factory) -> None:  # noqa: F811
    engine = FlakyEngine()
    rt = runtime_factory(engine)
    policy, held = RetryPolicy.of(rt.settings.worker), Held()
    runner = AttemptRunner(rt, policy, worker="w1", lease=30, leases=held, outputs=_writer(rt, policy))
    page = _registered(rt)
    with pytest.raises(JobNotFound):
        runner.run(PageMessage(job_id="no-such-job", lane=Lane.BATCH, message_priority=5))

    attempt = runner.run(_message(page))
    assert attempt is not None and attempt.decision.action is Action.DONE
    assert attempt.settled.outputs_due == (page.document_id,)
    assert held.asked == [page.job_id] and held.now == set()  # held while it ran, released after
    [row] = jobstore.get_jobs(rt.db, [page.job_id])
    assert (row.status, row.attempts, row.worker) == ("succeeded", 1, "w1")
    assert b"hello" in rt.store.get(document_key(page.document_id, OutputFormat.MD))
    # A redelivered message: nothing to do, no second engine call.
    assert runner.run(_message(page)) is None
    assert engine.calls == 1 and held.asked == [page.job_id]


def test_a_retryable_failure_is_settled_as_a_retry_after_the_policys_delay(runtime_factory) -> None:  # noqa: F811
    engine = FlakyEngine(down_for=1)
    rt = runtime_factory(engine, WORKER__MAX_ATTEMPTS="3", WORKER__RETRY_BACKOFF="7")
    policy = RetryPolicy.of(rt.settings.worker)
    runner = AttemptRunner(rt, policy, crash_limit=False)
    page = _registered(rt)

    first = runner.run(_message(page))
    assert first is not None and first.decision.action is Action.RETRY
    assert first.decision.delay == policy.delay(1) == 7 and first.decision.reason == "engine unreachable (stub)"
    [row] = jobstore.get_jobs(rt.db, [page.job_id])
    assert (row.status, row.attempts) == ("queued", 1)
    assert first.settled.outputs_due == ()  # the document is not finished

    second = runner.run(_message(page))
    assert second is not None and second.decision.action is Action.DONE and engine.calls == 2
    assert rt.batcher.expected == 0


def test_the_worker_and_paperlane_run_share_the_runner() -> None:
    """Both runtimes hand their pages to an AttemptRunner: neither claims nor settles a page itself."""
    import paperlane.workers.embedded as embedded
    import paperlane.workers.worker as worker

    for module in (worker, embedded):
        source = Path(module.__file__ or "").read_text()
        assert "AttemptRunner(" in source
        assert "start_attempt(" not in source and "settle(" not in source and "process_page(" not in source


@pytest.mark.processes  # the CPU pool
def test_a_workers_result_is_built_on_the_pool_and_comes_back_without_its_lines(runtime_factory) -> None:  # noqa: F811
    # As a worker runs it: the result built and stored on a pool process, back without its lines and blocks (the
    # stored JSON has them), the index row's line figures taken where the lines were, the document's outputs read
    # from the JSON handed to them.
    rt = runtime_factory(FlakyEngine(), WORKER__PREPROCESS_PROCESSES="1")
    rt.images_back = rt.results_back = False
    policy = RetryPolicy.of(rt.settings.worker)
    runner = AttemptRunner(rt, policy, worker="w1", lease=30, outputs=_writer(rt, policy))
    page = _registered(rt)
    attempt = runner.run(_message(page))
    assert attempt is not None and attempt.decision.action is Action.DONE
    outcome = attempt.outcome
    [row] = jobstore.get_jobs(rt.db, [page.job_id])
    stored = rt.store.get(row.result_key)
    whole = PageResult.model_validate_json(stored)
    assert [ln.text for ln in whole.lines] == ["hello"] and whole.lines[0].words  # built on the pool, words laid out
    assert not outcome.whole and outcome.result.lines == [] and outcome.result.text == "hello"
    assert outcome.stored_json == stored and outcome.annotated is None
    assert "postprocess" in whole.timings and outcome.timings["postprocess"] == whole.timings["postprocess"]
    with rt.db.session() as s:
        assert s.scalar(select(ResultRow.line_count).where(ResultRow.job_id == page.job_id)) == 1
    assert b"hello" in rt.store.get(document_key(page.document_id, OutputFormat.MD))
    # The preview was drawn on from its file (workers.previews), which the attempt removed, as it does a failed
    # page's: nothing stays behind for the pool's folder.
    failing = runtime_factory(FlakyEngine(permanent=True), WORKER__PREPROCESS_PROCESSES="1",
                              DATA_DIR=str(rt.settings.data_dir) + "-failing")
    failed = AttemptRunner(failing, RetryPolicy.of(failing.settings.worker), worker="w2", lease=30,
                           outputs=None).run(_message(_registered(failing)))
    assert failed is not None and failed.decision.action is not Action.DONE
    for runtime in (rt, failing):
        assert runtime.pool._previews is not None and not list(runtime.pool._previews.path.glob("*.raw"))


def test_a_document_reads_a_page_from_the_json_it_is_handed_before_the_stores_copy(runtime_factory) -> None:  # noqa: F811
    rt = runtime_factory(FlakyEngine())
    page = _registered(rt)
    attempt = AttemptRunner(rt, RetryPolicy.of(rt.settings.worker)).run(_message(page))
    assert attempt is not None and attempt.decision.action is Action.DONE
    [row] = jobstore.get_jobs(rt.db, [page.job_id])
    handed = attempt.outcome.result.model_copy(update={"text": "as handed"}).model_dump_json().encode()
    assert page_result(rt.store, row, source="s", page_no=1).text == "hello"
    assert page_result(rt.store, row, source="s", page_no=1, known={row.id: handed}).text == "as handed"
