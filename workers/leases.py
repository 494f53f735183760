"""A worker's lease keeper: renews the leases of the pages it runs, takes back pages whose lease ran out.

One thread per worker. Every third of ``worker.lease`` it pushes the leases of the pages it holds ahead
(one UPDATE), except a page held longer than ``worker.page_timeout`` (a hung engine call): that one is let
go, and taken back like a dead worker's. Then it takes back every page whose lease ran out, whoever held
it, and puts it on its lane through the delayed set (due at once); a page whose attempts are used up is
failed with the reason instead. Every ``worker.sweep_interval`` seconds (60) it also publishes queued pages
whose message never went out (a producer or worker died in between), and queued pages whose message Redis
lost (``priority.presence``), and refills the lanes' buffers from their fair-share structures (a refill lost
with a worker killed between its pop and its refill), or, with fair share off, moves whatever still waits there
onto the lanes' lists. Pages it publishes go behind their ingest and tenant
(``priority.fair``), read with them from the database.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta

import redis

from paperlane.errors import StorageUnavailable
from paperlane.priority import presence
from paperlane.priority.delayed import DelayedPages
from paperlane.priority.fair import FairLanes, Share
from paperlane.priority.lanes import Lane
from paperlane.priority.messages import PageMessage
from paperlane.retry import RetryPolicy
from paperlane.settings import WorkerSettings
from paperlane.status import JobStatus
from paperlane.storage import ingests, leases
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database, utcnow

log = logging.getLogger(__name__)

_UNPUBLISHED_AFTER = 60.0  # a page registered or taken back this long ago whose message is still not out


class LeaseKeeper:
    def __init__(self, db: Database, delayed: DelayedPages, client: redis.Redis, cfg: WorkerSettings,
                 policy: RetryPolicy, *, worker: str, fair: FairLanes | None = None, fair_share: bool = True) -> None:
        self.db, self.delayed, self.redis, self.cfg, self.policy, self.worker = db, delayed, client, cfg, policy, worker
        self.fair, self.fair_share = fair or FairLanes(client), fair_share
        self._held: dict[str, float] = {}  # job id -> when this worker started it (monotonic)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leases", daemon=True)
        self._swept = time.monotonic()
        self._cursor: tuple[datetime, str] | None = None  # the last page the lost-message check looked at

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def hold(self, job_id: str) -> None:
        with self._lock:
            self._held[job_id] = time.monotonic()

    def release(self, job_id: str) -> None:
        with self._lock:
            self._held.pop(job_id, None)

    def _run(self) -> None:
        # Every third of a lease, or more often when the sweep is due more often than that.
        while not self._stop.wait(min(self.cfg.lease / 3, self.cfg.sweep_interval)):
            try:
                self.tick()
            except StorageUnavailable as exc:
                log.warning("leases: %s", exc)
            except Exception:
                log.exception("leases")

    def tick(self) -> None:
        """Renew, take back, and now and then publish what never went out."""
        now = time.monotonic()
        with self._lock:
            live = [j for j, since in self._held.items() if now - since < self.cfg.page_timeout]
            hung = len(self._held) - len(live)
        if hung:
            log.warning("leases: %d pages held past page_timeout (%.0fs) are let go", hung, self.cfg.page_timeout)
        at = utcnow()
        leases.renew(self.db, live, worker=self.worker, until=at + timedelta(seconds=self.cfg.lease))
        back = leases.take_back(self.db, now=at, policy=self.policy)
        for page in back:
            log.warning("job %s: its lease (held by %s) ran out; %s", page.job_id, page.worker or "?",
                        "failed, its attempts used up" if page.failed else "back on its lane")
        self._publish([(p.job_id, p.lane, p.message_priority) for p in back if not p.failed])
        if now - self._swept >= self.cfg.sweep_interval:
            self._swept = now
            self.sweep()

    def sweep(self) -> None:
        """Publish the queued pages without a message: never sent, or lost by Redis; refill the lanes' buffers."""
        at = utcnow()
        self._publish(leases.unpublished(self.db, before=at - timedelta(seconds=_UNPUBLISHED_AFTER)))
        self._publish(self._lost(at))
        try:
            for lane in Lane:
                if self.fair_share:
                    self.fair.refill(lane)
                elif moved := self.fair.drain(lane):
                    log.warning("leases: fair share is off; %d pages waiting by fair share moved onto %s", moved,
                                lane.queue)
        except redis.RedisError as exc:
            raise StorageUnavailable(f"redis: {exc}") from exc

    def _lost(self, at: datetime) -> list[tuple[str, str, int]]:
        """Queued pages whose message is nowhere in Redis (lost between a pop and its un-acked record, by a
        worker killed or Redis stopped right then, or by a failover to a replica that had not received it yet).

        Each sweep looks at the next ``worker.lost_check_pages`` queued pages published long enough ago (a cursor
        through them, back to the start at the end) and asks Redis about those pages only (``priority.presence``):
        the cost of a sweep is bounded by that number, not by the backlog."""
        cfg = self.cfg
        since = at - timedelta(seconds=cfg.lost_after)
        batch = leases.queued_before(self.db, before=since, after=self._cursor, limit=cfg.lost_check_pages)
        self._cursor = (batch[-1].enqueued_at, batch[-1].job_id) if len(batch) == cfg.lost_check_pages else None
        try:
            suspects = presence.missing(self.redis, [q.job_id for q in batch])
            if suspects:
                there = presence.in_flight(self.redis, since=time.time() - cfg.lost_after)
                if self.fair_share:
                    there |= presence.in_buffers(self.redis)
                suspects = [j for j in suspects if j not in there]
        except redis.RedisError as exc:
            raise StorageUnavailable(f"redis: {exc}") from exc
        # Redis was read after the database: a page popped and started in between is no longer queued.
        still = {r.id for r in jobstore.get_jobs(self.db, suspects) if r.status == JobStatus.QUEUED.value}
        lost = [(q.job_id, q.lane, q.message_priority) for q in batch if q.job_id in still]
        if lost:
            log.warning("leases: %d queued pages had no message left in Redis; published again", len(lost))
        return lost

    def _publish(self, pages: list[tuple[str, str, int]]) -> None:
        if not pages:
            return
        owned = ingests.owners(self.db, [job_id for job_id, _, _ in pages])
        for job_id, lane, message_priority in pages:
            o = owned.get(job_id)
            share = Share.of(o.tenant_id, o.ingest_id, o.tenant_weight, o.ingest_weight) if o else None
            page = PageMessage(job_id=job_id, lane=Lane(lane), message_priority=message_priority, share=share)
            self.delayed.add(page, 0)
        jobstore.mark_enqueued(self.db, [job_id for job_id, _, _ in pages])
