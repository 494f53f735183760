"""Partitioned history on PostgreSQL (storage.history, migration 0010): today's rows carried into partitions and
back, one job per key across partitions, status lookups that read one partition, and retention."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg2
import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from typer.testing import CliRunner

from paperlane.cli import app
from paperlane.errors import PageNotFound
from paperlane.producer.submit import SubmittedPage, submit_documents
from paperlane.schemas import TaskSpec
from paperlane.storage import history, ingests, status_reads, timeids
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database, utcnow
from paperlane.storage.ingests import NewPage
from paperlane.storage.localfs import LocalStore
from paperlane.storage.tables import JobRow
from tests.pages import tiny_page
from tests.services import Service
from tests.test_ingests import doc, succeed


def _new_database(pg: Service) -> str:
    name = f"h_{uuid.uuid4().hex[:12]}"
    admin = psycopg2.connect(pg.url.replace("postgresql+psycopg2", "postgresql"))
    admin.autocommit = True
    admin.cursor().execute(f"CREATE DATABASE {name}")
    admin.close()
    return pg.url.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture
def pg(postgres_service: Service) -> Iterator[Database]:
    database = Database(_new_database(postgres_service))
    database.upgrade()
    yield database
    database.dispose()


def _partition_of(db: Database, table: str, key: str, value: str) -> str:
    with db.engine.connect() as conn:
        return str(conn.scalar(sa.text(f"SELECT tableoid::regclass FROM {table} WHERE {key} = :v"), {"v": value}))


def _submit(db: Database, tmp_path: Path, *names: str, data: bytes | None = None) -> list[SubmittedPage]:
    return submit_documents([doc(n, data if data is not None else tiny_page(i)) for i, n in enumerate(names)], db=db,
                            store=LocalStore(tmp_path), spec=TaskSpec())


_OLD_ROWS = """
INSERT INTO ingests (id, ingest_key, name, lane, task, task_options, documents_total, pages_total, pages_succeeded,
                     pages_failed, skipped, created_at, registered_at)
VALUES ('{i}', 'k', 'old', 'batch', 'spotting', '{{}}', 1, 2, 1, 0, 0, now(), now());
INSERT INTO documents (id, ingest_id, seq, source, name, ext, pages_total, pages_succeeded, pages_failed, created_at)
VALUES ('{d}', '{i}', 0, 'a.pdf', 'a', '.pdf', 2, 1, 0, now());
INSERT INTO jobs (id, job_key, content_sha256, source, page, lane, priority, task, task_options, status, attempts,
                  created_at, enqueued_at, updated_at, result_key)
VALUES ('{j1}', 'key1', 'c1', 'a.pdf', 1, 'batch', 5, 'spotting', '{{}}', 'succeeded', 1, now(), now(), now(), 'r1'),
       ('{j2}', 'key2', 'c2', 'a.pdf', 2, 'batch', 5, 'spotting', '{{}}', 'queued', 0, now(), now(), now(), NULL);
INSERT INTO results (job_id, content_sha256, task, engine, line_count, text, result_key, created_at)
VALUES ('{j1}', 'c1', 'spotting', 'stub', 1, 'hello', 'r1', now());
INSERT INTO pages (id, document_id, ingest_id, page_no, job_id, created_at)
VALUES ('{p1}', '{d}', '{i}', 1, '{j1}', now()), ('{p2}', '{d}', '{i}', 2, '{j2}', now())
"""


def test_the_migration_moves_todays_rows_into_partitions_and_back(postgres_service: Service) -> None:
    db = Database(_new_database(postgres_service))
    db.migrate("0009")
    ids = {k: str(uuid.uuid4()) for k in ("i", "d", "j1", "j2", "p1", "p2")}
    with db.engine.begin() as conn:
        for stmt in _OLD_ROWS.format(**ids).split(";"):
            conn.execute(sa.text(stmt))
    db.upgrade()
    legacy = f"{history.SCHEMA}.%s_{history.LEGACY}"
    assert _partition_of(db, "jobs", "id", ids["j2"]) == legacy % "jobs"
    assert _partition_of(db, "pages", "id", ids["p1"]) == legacy % "pages"
    assert _partition_of(db, "results", "job_id", ids["j1"]) == legacy % "results"
    with db.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT status FROM page_status ORDER BY page_no")).scalars().all() == [
            "succeeded", "queued"]
        assert dict(conn.execute(sa.text("SELECT job_key, job_id FROM job_keys")).all()) == {
            "key1": ids["j1"], "key2": ids["j2"]}
    # a key registered before the migration is still one job: a page asking for it again gets that job
    page = NewPage(id=timeids.mint(), document_id=ids["d"], page_no=3, job_id=timeids.mint())
    found = ingests.register(db, ids["i"], jobs=[_job_row(page.job_id, "key2")], documents=[], pages=[page])
    assert (found.new_jobs, page.job_id) == (set(), ids["j2"])
    db.migrate("0009", down=True)
    with db.engine.connect() as conn:
        assert conn.scalar(sa.text("SELECT count(*) FROM pages")) == 3
        assert conn.scalar(sa.text("SELECT relkind FROM pg_class WHERE relname = 'jobs'")) == "r"  # plain again
    with pytest.raises(IntegrityError), db.engine.begin() as conn:  # and its unique job key is back
        conn.execute(sa.text("INSERT INTO jobs SELECT * FROM jobs LIMIT 1"))
    db.dispose()


def _job_row(job_id: str, key: str) -> dict:
    now = utcnow()
    return dict(id=job_id, job_key=key, content_sha256="c", source="a.pdf", page=1, lane="batch", priority=5,
                task="spotting", task_options={}, status="queued", attempts=0, created_at=now, updated_at=now)


def test_a_key_registered_twice_even_at_once_is_one_job(db: Database, tmp_path: Path) -> None:
    first = _submit(db, tmp_path, "a", data=tiny_page(7))
    again = _submit(db, tmp_path, "b", data=tiny_page(7))  # another ingest, the same page: the same job
    assert again[0].job_id == first[0].job_id
    ingest_id = ingests.open_ingest(db, key="race", name="race", lane="batch", task="spotting", task_options={})[0].id
    barrier = threading.Barrier(4)
    pages = [NewPage(id=timeids.mint(), document_id=first[0].document_id, page_no=n, job_id="") for n in range(2, 6)]

    def register(page: NewPage) -> None:
        page.job_id = timeids.mint(name=page.id)
        barrier.wait()
        ingests.register(db, ingest_id, jobs=[_job_row(page.job_id, "raced")], documents=[], pages=[page])

    threads = [threading.Thread(target=register, args=(p,)) for p in pages]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with db.session() as s:
        assert s.scalar(sa.text("SELECT count(*) FROM jobs WHERE job_key = 'raced'")) == 1
        owner = s.scalar(sa.text("SELECT job_id FROM job_keys WHERE job_key = 'raced'"))
        assert s.execute(sa.text("SELECT DISTINCT job_id FROM pages WHERE ingest_id = :i"), {"i": ingest_id}
                         ).scalars().all() == [owner]


def _explain(db: Database, read: object) -> str:
    """EXPLAIN ANALYZE of every statement ``read()`` sends, as it sends it."""
    sent: list[tuple[str, object]] = []

    def keep(_conn: object, _cursor: object, statement: str, parameters: object, *_: object) -> None:
        sent.append((statement, parameters))

    sa.event.listen(db.engine, "before_cursor_execute", keep)
    try:
        read()  # type: ignore[operator]
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", keep)
    plans = []
    with db.engine.connect() as conn:
        for statement, parameters in sent:
            if statement.lstrip().upper().startswith("SELECT"):
                rows = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) {statement}",
                                            parameters)  # type: ignore[arg-type]
                plans.append("\n".join(r[0] for r in rows))
    return "\n".join(plans)


def _scanned(plan: str, table: str) -> set[str]:
    """The partitions of ``table`` the plan read (a partition pruned at execution shows ``never executed``)."""
    return {m.group(1) for line in plan.splitlines() if "never executed" not in line
            for m in [re.search(rf" on ({table}_(?:p\d{{6}}|{history.LEGACY}|{history.AHEAD}))\b", line)] if m}


def test_status_lookups_by_id_read_one_partition(pg: Database, tmp_path: Path) -> None:
    history.retain(pg, keep_days=None, ahead=11)  # twelve months and more to choose from
    pages = _submit(pg, tmp_path, "a", "b")
    succeed(pg, pages[0].job_id)
    jobstore.finish_failed(pg, pages[1].job_id, "cannot decode this image", "preprocess")
    page, month = pages[0], f"p{utcnow():%Y%m}"
    with pg.engine.connect() as conn:
        conn.execute(sa.text("ANALYZE"))
    lookups = {
        "page": lambda: status_reads.get_page(pg, page.page_id),
        "document": lambda: status_reads.document_progress(pg, page.document_id),
        "ingest": lambda: status_reads.ingest_progress(pg, page.ingest_id),
        "job": lambda: jobstore.get_job(pg, page.job_id),
    }
    for kind, read in lookups.items():
        plan = _explain(pg, read)
        assert _scanned(plan, "pages") <= {f"pages_{month}"}, (kind, plan)
        if kind in ("page", "job"):
            assert _scanned(plan, "jobs") == {f"jobs_{month}"}, (kind, plan)
    with pg.engine.connect() as conn:
        assert len(history.months(conn, "pages")) >= 12


def test_connections_never_plan_in_parallel_even_after_a_rolled_back_first_use(pg: Database) -> None:
    """A status count over a big ingest was planned in parallel: 0.2 ms of work behind 5-15 ms of starting
    workers (benchmarks/status_scale.py at 10M pages). The setting holds on every pooled connection."""
    fresh = Database(pg.url, pool_size=1)
    try:
        with fresh.session() as s:  # the first use of the only connection, rolled back
            s.execute(sa.text("SELECT 1"))
            s.rollback()
        with fresh.engine.connect() as conn:
            assert conn.execute(sa.text("SHOW max_parallel_workers_per_gather")).scalar_one() == "0"
    finally:
        fresh.engine.dispose()


def test_retention_makes_months_ahead_and_drops_finished_old_ones_only(pg: Database, tmp_path: Path) -> None:
    now = utcnow()
    far = timeids.mint(now + timedelta(days=200))  # past the months the migration made: lands ahead, moved later
    pg_job = _job_row(far, "far")
    with pg.session() as s:
        s.execute(sa.insert(JobRow.__table__), pg_job)
    assert _partition_of(pg, "jobs", "id", far).endswith("_ahead")
    made = history.retain(pg, keep_days=None, ahead=8)
    assert f"jobs_{history.suffix(history.add_months(history.month_start(now), 8))}" in made.created
    assert _partition_of(pg, "jobs", "id", far) == f"{history.SCHEMA}.jobs_p{timeids.time_of(far):%Y%m}"
    assert not made.dropped

    done, waiting = _submit(pg, tmp_path, "done"), _submit(pg, tmp_path, "waiting", data=tiny_page(3))
    succeed(pg, done[0].job_id)
    # a page of a newer month uses this month's job: the job stays while that page does
    newer = NewPage(id=timeids.mint(now + timedelta(days=100)), document_id=done[0].document_id, page_no=2,
                    job_id=done[0].job_id)
    ingests.register(pg, done[0].ingest_id, jobs=[], documents=[], pages=[newer])
    later = now + timedelta(days=400)  # with 300 days' retention: this month is past it then, the newer one not
    kept = history.retain(pg, keep_days=300, now=later)
    month = history.suffix(history.month_start(now))
    assert "not finished" in dict(kept.kept)[month]  # one page still queued
    assert not {f"pages_{month}", f"jobs_{month}"} & {name for name, _ in kept.dropped}

    succeed(pg, waiting[0].job_id)
    ran = history.retain(pg, keep_days=300, now=later)
    print("\n".join(ran.lines()))
    assert f"pages_{month}" in [name for name, _ in ran.dropped]
    assert (f"jobs_{month}", "its jobs are used by pages of a newer month") in ran.kept
    with pytest.raises(PageNotFound):
        status_reads.get_page(pg, done[0].page_id)
    _, progress, _ = status_reads.ingest_progress(pg, done[0].ingest_id)  # its counts stay with the ingest
    assert (progress.total, progress.succeeded) == (2, 2)

    with pg.session() as s:
        s.execute(sa.text("DELETE FROM pages WHERE id = :p"), {"p": newer.id})
    gone = history.retain(pg, keep_days=300, now=later)
    assert {f"jobs_{month}", f"results_{month}"} <= {name for name, _ in gone.dropped}
    with pg.session() as s:
        assert s.scalar(sa.text("SELECT count(*) FROM job_keys WHERE job_id IN :ids").bindparams(
            sa.bindparam("ids", expanding=True)), {"ids": [done[0].job_id, waiting[0].job_id]}) == 0


def test_the_retention_command_runs_it_and_sqlite_has_nothing_to_do(pg: Database, tmp_path: Path) -> None:
    runner = CliRunner()
    answer = runner.invoke(app, ["db", "retention", "--keep-days", "30"], env={"PAPERLANE_DATABASE__URL": pg.url})
    assert answer.exit_code == 0, answer.output
    assert "nothing to do" in answer.output  # made ahead by the migration already, nothing old
    lite = Database(f"sqlite:///{tmp_path / 'e.db'}")
    lite.upgrade()
    assert history.retain(lite, keep_days=1).lines() == []


def test_a_detach_cut_short_is_finished_and_dropped_by_the_next_run(pg: Database) -> None:
    month = history.add_months(history.month_start(utcnow()), 2)  # made by the migration, empty
    name = f"pages_{history.suffix(month)}"
    reader = pg.engine.connect()
    reader.execute(sa.text("SELECT count(*) FROM pages"))  # an open transaction: the detach's second step waits
    detacher = pg.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    pid = detacher.scalar(sa.text("SELECT pg_backend_pid()"))
    failed: list[BaseException] = []

    def detach() -> None:
        try:
            detacher.execute(sa.text(f"ALTER TABLE pages DETACH PARTITION {history.SCHEMA}.{name} CONCURRENTLY"))
        except sa.exc.DBAPIError as exc:
            failed.append(exc)

    worker = threading.Thread(target=detach)
    worker.start()
    with pg.engine.connect() as conn:
        waiting = sa.text("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = :p")
        while worker.is_alive() and not conn.scalar(waiting, {"p": pid}):
            worker.join(0.05)
        conn.execute(sa.text("SELECT pg_cancel_backend(:p)"), {"p": pid})  # the run is killed mid-detach
    worker.join()
    reader.close()
    detacher.close()
    assert failed, "the detach was not cut short"
    with pg.engine.connect() as conn:
        assert conn.scalar(sa.text("SELECT bool_or(inhdetachpending) FROM pg_inherits")) is True
    ran = history.retain(pg, keep_days=None)
    assert (name, 0) in ran.dropped
    with pg.engine.connect() as conn:
        assert conn.scalar(sa.text("SELECT to_regclass(:n)"), {"n": f"{history.SCHEMA}.{name}"}) is None


def test_time_first_ids_sort_by_time_and_derive_the_same_id_in_their_parents_span() -> None:
    now = utcnow()
    earlier, later = timeids.mint(now - timedelta(milliseconds=1)), timeids.mint(now)
    assert earlier < later and timeids.floor(now) <= later < timeids.floor(now + timedelta(milliseconds=1))
    assert timeids.time_of(later) == now.replace(microsecond=now.microsecond // 1000 * 1000)
    document = timeids.derived(later, "document:a.pdf")
    assert document == timeids.derived(later, "document:a.pdf") != timeids.derived(later, "document:b.pdf")
    low, high = timeids.span(later)  # type: ignore[misc]
    assert low <= document <= high and timeids.time_of(document) == timeids.time_of(later)
    legacy = str(uuid.uuid5(uuid.NAMESPACE_URL, "made before"))
    assert legacy < timeids.floor(now) and timeids.span(legacy) is None and timeids.time_of(legacy) is None
    assert ingests.page_id_for(legacy, 1) == ingests.page_id_for(legacy, 1) and not timeids.is_time_first(
        ingests.page_id_for(legacy, 1))  # an ingest made before keeps deriving its ids the old way
